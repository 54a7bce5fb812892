"""Package data (shipped as stream_anon.data); read through stream_anon.contract."""
