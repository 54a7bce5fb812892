"""Stream configs of the [input] mapping layer (stream_anon.inputs): real formats read without adapter code."""
