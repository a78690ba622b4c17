"""The APIs coding agents speak, each a translation onto the chat path: OpenAI's Responses API
(Codex CLI) and Anthropic's Messages API (Claude Code)."""

from fastapi import APIRouter

from minisgl.server.agents.anthropic_messages import router as _messages
from minisgl.server.agents.responses_api import router as _responses

router = APIRouter()
router.include_router(_responses)
router.include_router(_messages)
