"""The recipe's steps (sapp/emit/recipe.py), one module per concern.  Each step changes the model, or
one pipeline stage `s` of it, in place, and takes what it reads by name: the groups of sapp/emit/build.py
(`Rank`, `Layout`, `Training`, `RecomputePlan`, `Placement`, `Audit`) and `Made`, what the steps
before it made, where it writes its results (or it returns them, as `pipeline.split` and
`recomputation.apply`); none takes the whole `Build`.  Each docstring says what is read and what
written.  How a concern
works lives in its own package (tp/, cp/, pp/, ep/, dp/, host/, recompute/)."""
