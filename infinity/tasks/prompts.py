"""The prompts of an embedding model: text put before each input, named in its sentence-transformers config."""
from __future__ import annotations

from pathlib import Path

from infinity.engine.job import Job
from infinity.errors import ValidationError
from infinity.manifest import Manifest
from infinity.tasks.base import Task


class PromptedTask(Task):
    """A task whose texts may get one of the model's prompts before them (dense and sparse embeddings)."""

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        super().__init__(manifest, directory)
        self.default_prompt_name = manifest.task.default_prompt_name

    def use_default_prompt(self, name: str) -> None:
        """Serve with this prompt when a request names none (instead of the model's own default)."""
        if name not in self.manifest.task.prompts:
            raise ValueError(f"the default prompt name {name!r} is not one of the model's prompts "
                             f"({', '.join(self.manifest.task.prompts) or 'it has none'})")
        self.default_prompt_name = name

    def prompt(self, name: str | None) -> str:
        """The text of the named prompt, or of the default one; "" where neither is set."""
        name = self.default_prompt_name if name is None else name
        if name is None:
            return ""
        prompts = self.manifest.task.prompts
        if name not in prompts:
            known = f"this model's prompts are {', '.join(prompts)}" if prompts else "this model has no prompts"
            raise ValidationError(f"unknown prompt_name {name!r}: {known}")
        return prompts[name]

    def prompted(self, request: Job, name: str | None) -> Job:
        """The request's texts with the prompt before each (so token counts and truncation include it); token
        ids run as given."""
        if request.token_ids is not None:
            if name is not None:
                raise ValidationError("prompt_name applies to texts, not to token ids")
            return request
        prompt = self.prompt(name)
        if prompt:
            request.texts = [prompt + text for text in request.texts]  # type: ignore[operator]  # texts, not pairs
        return request
