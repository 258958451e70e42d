"""Pipeline stages: one concern each (evidence cache, budget, settle), in `app.build_stages` order."""
