"""Demo data, made on the spot and the same bytes every time (``msd synth DIR [--kind ...]``):
``text`` the Parquet sources with long-tailed lengths (and the helpers the others write with),
``vlm`` image-text sources, ``video`` video-text ones, ``chat`` conversations and their chat
template."""
