"""How an answer's tokens are chosen and become what the API returns: sampling and grammars
(`sampling`, `constrain`), streamed text with stop strings (`textstream`), log probabilities
(`logprobs`), and the parsers that read tool calls and boxes out of an answer (`toolcalls`,
`grounding`)."""
