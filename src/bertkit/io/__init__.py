"""Files in and out, below every other layer: atomic writes (atomic.py), the corpus reader (textlines.py), a
user's text file read whole with one set of error messages (textfile.py), Parquet and `datasets` tables
(columnar.py) and JSON files (jsonfile.py). No torch; only `bertkit.errors` from bertkit."""
