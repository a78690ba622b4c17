"""Images in requests: parsing the APIs' image parts (``items.py``), fetching and decoding them
(``fetch.py``, ``decode.py``), preprocessing for a checkpoint and expanding the chat template's
placeholders (``processor.py``), and Qwen's multimodal rotary positions (``mrope.py``). Everything
here runs off the GPU: in the API server and the tokenizer workers, except the typed hand-off
(``prompt.py``) and the positions (``mrope.py``), which the engine reads (``engine/images.py``)."""
