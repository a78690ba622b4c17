"""``/generate``: SGLang's native endpoint (text or token ids in, text, ids and ``meta_info``
out), which SGLang's router and tools call. A vision model's text prompt may carry
``image_data``, one image per placeholder the text holds (Qwen's ``<|image_pad|>``, Gemma 3's
``<start_of_image>``, Gemma 4's ``<|image|>``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl.server.openai import structured
from minisgl.server.openai.bodies import finite
from minisgl.server.openai.call import respond
from minisgl.server.openai.echo import generate_prompt_logprobs
from minisgl.server.openai.fields import ROUTER_NO_MODEL
from minisgl.server.openai.generation_defaults import apply_to_dict
from minisgl.server.openai.images import generate_images, load_images
from minisgl.server.openai.protocol import GenerateRequest, parse
from minisgl.server.openai.request_context import check_model, read_json, start_call
from minisgl.server.openai.validation import check_limits

router = APIRouter()


@router.post("/generate")
async def generate(request: Request) -> Response:
    req = parse(GenerateRequest, await read_json(request))
    req.sampling_params = apply_to_dict(req.sampling_params, request.app.state.sampling_defaults)
    check_model(request, None if req.model == ROUTER_NO_MODEL else req.model)
    fields: dict = {"text": req.text} if req.text is not None else {"input_ids": req.input_ids}
    params = check_limits(req.params(), "sampling_params.")
    refs = generate_images(request, req.image_data, req.text)
    if params.grammar is not None:
        await structured.check((*params.grammar, f"sampling_params.{params.grammar[0]}"))
    if refs:  # fetched once all else is checked
        fields["images"] = await load_images(request, refs)
    call = await start_call(request, [(fields, params, 0)], None, req.text or req.input_ids)
    (state,) = call.states.values()

    def body() -> dict:
        meta = {"id": str(state.uid), "prompt_tokens": state.prompt_tokens,
                "completion_tokens": len(state.token_ids), "cached_tokens": state.cached_tokens,
                "finish_reason": state.finish_reason}
        if req.return_logprob or state.logprobs:
            meta["output_token_logprobs"] = [[finite(lp), t] for t, lp, _ in state.logprobs]
            meta["output_top_logprobs"] = [[[finite(b), a] for a, b in top]
                                           for _, _, top in state.logprobs]
        if state.prompt_logprobs is not None:
            meta.update(generate_prompt_logprobs(state))
        return {"text": "".join(state.text), "output_ids": state.token_ids, "meta_info": meta}

    async def render() -> dict:
        return body()

    return await respond(call, req.stream, render, [], lambda s, r: body(), lambda: [])
