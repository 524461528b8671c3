"""Training of the m4 model (Ray Train, MLflow, Ray Tune). Not built yet: see the issues."""
