package prefix

import (
	"encoding/json"
)

// promptView is what the prefix affinity reads of a request body: the
// completions prompt or the chat messages.
type promptView struct {
	Prompt   json.RawMessage `json:"prompt"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// PromptText returns the text the prefix affinity hashes, or nil when the
// request has none it can use: a completions prompt given as one string
// (a list of prompts, or token ids, get no affinity: the normal pick), or
// the chat messages in order, each as its role, a newline, its text (a
// string, or the text parts of a list) and a newline, so a conversation
// whose history grows shares its earlier turns as a prefix. A body that is
// not JSON gets nil too; its errors are the proxy's to report.
func PromptText(body []byte) []byte {
	var v promptView
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	if len(v.Prompt) > 0 {
		var s string
		if json.Unmarshal(v.Prompt, &s) != nil {
			return nil
		}
		return []byte(s)
	}
	var out []byte
	for _, m := range v.Messages {
		out = append(out, m.Role...)
		out = append(out, '\n')
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			out = append(out, s...)
		} else {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) == nil {
				for _, p := range parts {
					if p.Type == "text" {
						out = append(out, p.Text...)
					}
				}
			}
		}
		out = append(out, '\n')
	}
	return out
}
