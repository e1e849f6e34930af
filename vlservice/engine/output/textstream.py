"""Token ids in, text deltas out: whole UTF-8 characters only, stop strings held back and cut."""

from __future__ import annotations


class TextStream:
    """Token ids in, text deltas out: whole UTF-8 characters only, stop strings held back and cut."""

    def __init__(self, tokenizer, stop: tuple = ()):
        self.tok = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already sent
        self.stopped = False

    def text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):  # half a character: wait for the rest
            return ""
        for s in self.stop:
            at = text.find(s, max(0, self.emitted - len(s)))
            if at != -1:
                self.stopped = True
                delta = text[self.emitted:at]
                self.emitted = at
                return delta
        safe = len(text)
        for s in self.stop:  # hold back a tail that could be the start of a stop string
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        delta = text[self.emitted:safe]
        self.emitted = max(self.emitted, safe)
        return delta

    def text_sent(self) -> str:
        """Everything emitted so far (after `flush`: the whole answer as the client saw it)."""
        return self.text()[:self.emitted]

    def flush(self) -> str:
        if self.stopped:
            return ""
        text = self.text().rstrip("\ufffd")
        delta = text[self.emitted:]
        self.emitted = len(text)
        return delta
