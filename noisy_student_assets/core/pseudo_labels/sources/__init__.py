"""Who weighs each sample's vote in a pseudo-label: one module per label source, one entry per source in
`registry.py`."""
