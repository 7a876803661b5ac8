"""Export a run to other tools: :func:`to_inference_data` builds an :class:`arviz.InferenceData`."""

from .inference_data import to_inference_data

__all__ = ["to_inference_data"]
