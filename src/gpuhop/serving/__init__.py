"""gpuhop's model server: runs as a serving job on the GPU host (`python -m gpuhop.serving`).

`gpuhop serve` starts it as a job's command. It loads one SavedModel with TensorFlow and
answers TensorFlow Serving's REST API (`/v1/models/NAME`, `/metadata`, `:predict`) on the
host's loopback only; users reach it through the agent's authenticated proxy
(`/v1/serve/JOB/...`) or `gpuhop forward`. Concurrent predict requests are gathered into
batches (see `batching`).

The parts: `codec` (a :predict body to numpy and the answer back, as TF Serving reads and
writes them), `tensors` (one JSON value to an array and back), `errors` (TF Serving's
error answers; none of these three needs TensorFlow), `batching` (the batcher; no
TensorFlow), `model` (the SavedModel, TensorFlow), `app` (the HTTP routes),
`__main__` (start-up and the ready file the agent reads).
"""
