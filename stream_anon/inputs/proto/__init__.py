"""Generated protobuf classes (see each ``.proto`` file's header for its source and how to regenerate)."""
