"""A Hugging Face tokenizer and chat template without ``transformers``.

``tokenizers`` reads ``tokenizer.json``; ``tokenizer_config.json`` (or ``chat_template.jinja``)
gives the chat template and the special tokens it uses, rendered with a sandboxed jinja2
environment configured as ``transformers`` configures it (trim_blocks, lstrip_blocks,
``raise_exception``, a ``tojson`` that keeps non-ASCII). Chat prompts are rendered with the
generation prompt and encoded without adding special tokens (the template has them), plain
prompts with them, which is what vLLM sends to the model: the ids, hence the blocks, match.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from router.core.errors import BadRequest

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


class HFTokenizer:
    """``tokenizer.json`` + chat template from a model folder (or a tokenizer.json path)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        folder = path if path.is_dir() else path.parent
        tok_file = path / "tokenizer.json" if path.is_dir() else path
        if not tok_file.is_file():
            raise ValueError(f"no tokenizer.json at {path}")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        config: dict[str, Any] = {}
        config_file = folder / "tokenizer_config.json"
        if config_file.is_file():
            config = json.loads(config_file.read_text())
        self.special = {k: _token_text(config.get(k)) for k in _SPECIAL_KEYS}
        template = _pick_template(config.get("chat_template"))
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        self.chat_template_source = template
        self._template = _compile(template) if template else None

    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        """Token ids of ``text`` as uint32 (one C call, one array conversion)."""
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return np.asarray(ids, dtype=np.uint32)

    def render_chat(self, body: dict[str, Any]) -> str:
        """The prompt text the worker's template makes of a chat request."""
        if self._template is None:
            raise BadRequest("the tokenizer has no chat template", code="no_chat_template")
        kwargs = body.get("chat_template_kwargs")
        extra = kwargs if isinstance(kwargs, dict) else {}
        add_generation_prompt = body.get("add_generation_prompt", True)
        if body.get("continue_final_message"):
            add_generation_prompt = False
        try:
            return self._template.render(
                messages=body["messages"],
                tools=body.get("tools"),
                add_generation_prompt=add_generation_prompt,
                **self.special,
                **extra,
            )
        except Exception as exc:  # jinja TemplateError, raise_exception, bad message shapes
            raise BadRequest(f"chat template failed: {exc}", code="chat_template_error") from None


def _token_text(value: Any) -> str | None:
    """Special tokens are strings or serialized AddedToken objects ({"content": ...})."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _pick_template(value: Any) -> str | None:
    """A template string, or the ``default`` one of a list of named templates."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return value


def _compile(source: str):
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
