"""Text <-> tokens for one LLM version: the ``tokenizers`` library, the chat template rendered in
Jinja2's sandbox, and incremental detokenization that never emits half a character."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ortserve.errors import ConfigError, InvalidInput

__all__ = ["Detokenizer", "TextTokenizer"]

_REPLACEMENT = "\ufffd"


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _raise(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


class TextTokenizer:
    """Encodes prompts, renders chat conversations, decodes tokens.

    Args:
        folder: the version folder (tokenizer.json, tokenizer_config.json).
        tokenizer_config: the parsed tokenizer_config.json ({} when absent).
    """

    def __init__(self, folder: Path, tokenizer_config: dict[str, object]) -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the library raises its own untyped errors
            raise ConfigError(f"{folder / 'tokenizer.json'}: cannot load the tokenizer: {exc}") from exc
        self._texts: dict[int, str] = {}
        self.bos_token = _token_text(tokenizer_config.get("bos_token")) or ""
        self.eos_token = _token_text(tokenizer_config.get("eos_token")) or ""
        template = tokenizer_config.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self._template = None
        if isinstance(template, str):
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            try:
                self._template = env.from_string(template)
            except TemplateError as exc:
                raise ConfigError(f"{folder / 'tokenizer_config.json'}: chat_template: {exc}") from exc

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size())

    def token_id(self, token: str) -> int | None:
        value = self._tokenizer.token_to_id(token)
        return None if value is None else int(value)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of ``text``; ``special`` adds what the tokenizer's post-processor adds (BOS)."""
        return list(self._tokenizer.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` holds it (for the grammar engine)."""
        return str(self._tokenizer.to_str())

    def token_text(self, token: int) -> str:
        """One token's text as it reads inside a longer text (its leading space kept), for
        logprobs and ``/tokenize``'s token strings."""
        text = self._texts.get(token)
        if text is None:
            raw = self._tokenizer.id_to_token(token) or ""
            decoded = str(self._tokenizer.decode([token], skip_special_tokens=False))
            text = (
                " " + decoded
                if raw.startswith(("\u2581", "\u0120")) and not decoded.startswith(" ")
                else decoded
            )
            if len(self._texts) < 1 << 18:
                self._texts[token] = text
        return text

    def render_chat(
        self,
        messages: list[dict[str, object]],
        add_generation_prompt: bool = True,
        extra: Mapping[str, object] | None = None,
    ) -> str:
        """The conversation as the model's chat template writes it, ready for the answer.

        Args:
            messages: the conversation.
            add_generation_prompt: end with the assistant's turn opening.
            extra: more template variables (``tools``, ``chat_template_kwargs``); they cannot
                replace the ones above.

        Raises:
            InvalidInput: the model has no chat template, or the template refuses the messages.
        """
        if self._template is None:
            raise InvalidInput("this model has no chat_template; use /v1/completions")
        from jinja2 import TemplateError

        try:
            return self._template.render(
                {
                    **(extra or {}),
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "bos_token": self.bos_token,
                    "eos_token": self.eos_token,
                }
            )
        except TemplateError as exc:
            raise InvalidInput(f"the chat template cannot render these messages: {exc}") from exc


class Detokenizer:
    """Turns generated tokens into text deltas as they come.

    Decoding a token alone is wrong for byte-level and sentencepiece vocabularies (leading
    spaces, characters split over tokens), and decoding everything per token is quadratic; so a
    short window is decoded and only text past what was already emitted is returned, held back
    while it ends in an incomplete character.
    """

    __slots__ = ("_ids", "_prefix", "_read", "_tokenizer")

    def __init__(self, tokenizer: TextTokenizer, context: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids = list(context[-4:])  # a little context so the first token's space is right
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token: int) -> str:
        """The new text that ``token`` completes (may be "")."""
        self._ids.append(token)
        before = self._tokenizer.decode(self._ids[self._prefix : self._read])
        text = self._tokenizer.decode(self._ids[self._prefix :])
        if len(text) <= len(before) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before) :]
