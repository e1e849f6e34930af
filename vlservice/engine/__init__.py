"""The engine: everything that runs the model, and nothing that knows HTTP.

`service.VLModelService` is the entry point; `types` holds what a request is. Images and vision
know no Flask; the service's worker threads are the only code that calls the model.
"""

from .types import ChatRequest, Event, ImageInput, Message, Sampling

__all__ = ["ChatRequest", "Event", "ImageInput", "Message", "Sampling"]
