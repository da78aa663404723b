"""The models: the library (Hub search, downloads), the models folder, the picker's entries, the models opened from files."""
