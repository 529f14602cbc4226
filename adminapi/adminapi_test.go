package adminapi

import "testing"

func FuzzDecodeFault(f *testing.F) {
	f.Add([]byte(`{"kind":"kill-engine","region":"a","cells":[0]}`))
	f.Add([]byte(`{"kind":"wan-delay","region":"a","delay_ms":20,"jitter_ms":5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := DecodeFault(b)
		if err != nil {
			return
		}
		if err := fl.Validate(); err != nil {
			t.Fatalf("decoded fault fails Validate: %v", err)
		}
	})
}
