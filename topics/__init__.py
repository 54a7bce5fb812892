"""Package data (shipped as stream_anon.topics); read through stream_anon.contract."""
