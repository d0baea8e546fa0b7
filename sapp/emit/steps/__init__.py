"""The recipe's steps (sapp/emit/recipe.py), one module per concern.  Each step reads the shared
`Build` (sapp/emit/build.py) and changes the model, or one pipeline stage `s` of it, in place; how a
concern works lives in its own package (tp/, cp/, pp/, ep/, dp/, host/, recompute/)."""
