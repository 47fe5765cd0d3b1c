"""Dataset format v1, manifest, behaviour policies and collection."""
