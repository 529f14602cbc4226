// Package prefix owns isobar's approximate view of what each engine's
// prefix cache holds: the hash chains of prompt blocks a router has
// recently sent to each host, and the hashing of prompt text into such
// chains. The gateway's --lb isobar pick and the benchmark read it to
// prefer a host that probably holds a request's leading blocks
// (gateway/placement: the affinity band).
//
// # The model
//
// An engine with automatic prefix caching (vLLM's) keys KV blocks by a
// hash chain over fixed-size blocks of the prompt: block i's hash names
// block i and everything before it, so a chain is found from its start.
// A router cannot see the engine's cache; it sees what it sent. Index
// keeps, per host, the block hashes of the prompts sent there, in
// least-recently-sent order, bounded by the host's KV capacity in blocks:
// an engine can hold at most that many, and evicts the least recently
// used first. Record touches a chain tail first, so its head is the most
// recent (vLLM frees a request's blocks in reverse, so its head outlives
// its tail). Match counts how many leading blocks of a chain the host
// probably holds. The view is approximate: the engine also evicts for its
// running sequences, and another router may fill it.
//
// TextChain hashes a prompt's text into a chain of blocks of BlockBytes
// bytes (64: 16 tokens at the 4 bytes per token the control plane assumes
// everywhere, xdscontract.BytesPerToken): the same text always gives the
// same chain, and two prompts share block i only if they share every
// byte up to its end. PromptText (text.go) is the text of a request body
// that is hashed: a completions prompt string, or the chat messages' roles
// and text in order.
//
// # Bounds
//
// Memory is bounded whatever clients send: a chain is cut at
// Config.MaxBlocksPerRequest, a host holds at most its capacity (itself
// capped at Config.MaxBlocksPerHost), and at most Config.MaxHosts hosts
// are tracked (the least recently recorded host is dropped first).
//
// # Concurrency
//
// An Index is safe for concurrent use: one mutex guards it, held for one
// Match or Record (O(chain length)). TextChain and PromptText are pure.
package prefix
