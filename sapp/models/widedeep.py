"""Wide & Deep for Criteo-like data: `dense` continuous features and `fields` categorical ones.

Tables: each categorical field has `rows_per_field` rows.  All fields share ONE deep table
`deep_emb` [fields * rows_per_field, dim] and ONE wide table `wide_emb` [fields * rows_per_field, 1];
field i's ids are shifted by i * rows_per_field (the `offsets` buffer) so every field owns its own
row range.  One table per part makes the host/device placement decision a single choice per part.
"Vocabulary" (the `vocab` override) means the TOTAL number of rows of the deep table, split evenly
over the fields: wide-deep-100m has vocab=100M (3,846,154 rows per field), wide-deep-1m vocab=1M.

Inputs: dense [b, dense] float, ids [b, fields] int64 in [0, rows_per_field).  Output: logit [b]
(wide + deep), trained with BCE-with-logits against a 0/1 float target."""
import torch
from torch import nn


class WideDeep(nn.Module):
    def __init__(self, rows_per_field=1_000_000, dense=13, fields=26, dim=80, deep=(1024, 512, 256),
                 sparse=True, vocab=None):
        super().__init__()
        rows = fields * rows_per_field
        self.wide_emb = nn.Embedding(rows, 1, sparse=sparse)
        self.wide_dense = nn.Linear(dense, 1)
        self.deep_emb = nn.Embedding(rows, dim, sparse=sparse)
        layers, din = [], dense + fields * dim
        for w in deep:
            layers += [nn.Linear(din, w), nn.ReLU()]
            din = w
        layers.append(nn.Linear(din, 1))
        self.deep = nn.Sequential(*layers)
        self.register_buffer("offsets", torch.arange(fields, dtype=torch.long) * rows_per_field,
                             persistent=False)

    def forward(self, dense, ids):
        ids = ids + self.offsets
        wide = self.wide_emb(ids).sum(dim=(1, 2)) + self.wide_dense(dense).squeeze(-1)
        x = torch.cat([dense, self.deep_emb(ids).flatten(1)], dim=1)
        return wide + self.deep(x).squeeze(-1)


def param_count(rows_per_field=1_000_000, dense=13, fields=26, dim=80, deep=(1024, 512, 256), **_):
    rows = fields * rows_per_field
    n = rows * (1 + dim) + dense + 1
    din = dense + fields * dim
    for w in list(deep) + [1]:
        n += din * w + w
        din = w
    return n
