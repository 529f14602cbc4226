package completion

import (
	"math/rand/v2"
	"strings"
)

// promptWords are what generated prompts are made of: common words, so
// that the text reads like text. Two random prompts' first 64 bytes (their
// first 16-token block, about 12 words) coincide with odds below 1 in
// 10^20.
var promptWords = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
	"he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
	"one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
	"region", "cell", "engine", "token", "cache", "prefix", "route", "model", "latency", "traffic", "queue", "block", "batch", "request", "reply", "plan",
}

// PromptText returns random words from r, exactly 4×tokens bytes: an
// engine (and isobar's routes) counting one token per 4 bytes of text sees
// tokens tokens. The same source state gives the same text, so a prefix
// cache sees two prompts built from the same seed as sharing it, and
// prompts from different seeds as sharing nothing.
func PromptText(r *rand.Rand, tokens int) string {
	n := max(tokens, 0) * 4
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(promptWords[r.IntN(len(promptWords))])
	}
	return b.String()[:n]
}
