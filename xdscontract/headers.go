package xdscontract

// Request headers the routes match.
const (
	// DefaultModelHeader is the default header selecting a model. The
	// server's routes and a data plane's matcher must use the same one.
	DefaultModelHeader = "x-isobar-model"
	// DefaultHopHeader is the default header marking traffic forwarded from
	// another region's data plane (any value); such requests go to a
	// model's local-only clusters, are never forwarded again and never
	// shed.
	DefaultHopHeader = "x-isobar-hop"
	// PromptTokensHeader carries a client's count of the tokens its request
	// needs (the prompt, plus max_tokens when the client wants the class to
	// cover the whole context), as a decimal integer. It selects the
	// context-length class.
	PromptTokensHeader = "x-isobar-prompt-tokens"
	// BytesPerToken is the convention used when PromptTokensHeader is
	// absent: the request's content-length over 4, rounded up, counts as its
	// token need. isobar's simulated engine counts a prompt of n bytes as
	// ceil(n/4) tokens; JSON framing makes the estimate a little high, which
	// errs towards the larger class.
	BytesPerToken = 4
)
