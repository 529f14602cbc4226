package load

import (
	"math/rand/v2"
	"strings"

	"github.com/isobar-mesh/isobar/completion"
)

// Text returns the shape's prompt as text: each segment's words from a
// source seeded by its key alone (completion.PromptText), so prompts holding the same
// segment hold the same text there, and a prefix cache finds what the
// shapes share.
func (s Shape) Text() string {
	var b strings.Builder
	b.Grow(4 * s.Prompt)
	for _, sg := range s.Segments {
		b.WriteString(completion.PromptText(rand.New(rand.NewPCG(sg.Key, 0x7e47)), sg.Tokens))
	}
	if b.Len() < 4*s.Prompt { // a shape without segments
		b.WriteString(strings.Repeat("tok ", s.Prompt-b.Len()/4))
	}
	return b.String()
}
