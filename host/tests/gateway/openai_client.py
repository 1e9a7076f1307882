"""The `openai` package against `suffuse gateway`: a streamed chat, a plain
completion and an embedding, printed as one JSON line for the Rust test
(host/tests/gateway_openai.rs) to check."""

import json
import sys

from openai import OpenAI

base_url, embed_text, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = OpenAI(base_url=base_url, api_key="not-used")

text, chunks, usage = "", 0, None
stream = client.chat.completions.create(
    model="tiny-llama",
    messages=[{"role": "user", "content": "hi there"}],
    temperature=0.8,
    seed=seed,
    stream=True,
)
for chunk in stream:
    chunks += 1
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens

done = client.completions.create(model="tiny-llama", prompt="once upon", max_tokens=4, temperature=0)
vectors = client.embeddings.create(model="demo", input=embed_text)
models = [m.id for m in client.models.list()]

print(json.dumps({
    "stream_text": text,
    "stream_chunks": chunks,
    "stream_completion_tokens": usage,
    "completion_text": done.choices[0].text,
    "completion_finish": done.choices[0].finish_reason,
    "completion_tokens": done.usage.completion_tokens,
    "embedding": vectors.data[0].embedding,
    "models": models,
}))
