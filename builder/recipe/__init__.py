"""Recipes: YAML loaded into the Recipe model, checked by the compatibility rules into a Spec."""
