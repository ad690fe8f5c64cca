"""Rules and traits a template family's kinds share (``sm90``: CUTLASS 3.x), so that no kind imports another."""
