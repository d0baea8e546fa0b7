"""The checks before the recipe's first step (before.py: plan, model, shapes at one rank's split) and
the manifest after its last (manifest.py: what was built against what the plan says)."""
