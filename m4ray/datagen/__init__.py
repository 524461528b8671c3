"""Training data for m4: scenario families, ns-3 recording, busy periods, the dataset."""
