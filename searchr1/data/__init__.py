"""searchr1.data: prompts and tags (``prompts``), dataset formats (``formats``: FlashRAG jsonl,
Search-R1 parquet, hub datasets -> ``Sample``), the embedded synthetic world (``synth``) and the
``searchr1 data`` command (``cli``)."""
