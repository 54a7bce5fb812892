"""Package data (shipped as stream_anon.configs); read through stream_anon.contract."""
