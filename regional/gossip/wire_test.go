package gossip

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	p := newPeer(t, "regional/x", RoleRegional, "x")
	m, err := decodeMeta(p.meta())
	if err != nil {
		t.Fatal(err)
	}
	if m.Role != RoleRegional || m.Region != "x" || m.Ingress != "x:1" || !bytes.Equal(m.PubKey, p.pub()) {
		t.Errorf("decoded %+v", m)
	}
	// A later version may append fields.
	if _, err := decodeMeta(append(p.meta(), 1, 2, 3)); err != nil {
		t.Errorf("appended fields refused: %v", err)
	}
	for name, b := range map[string][]byte{
		"empty":              nil,
		"version 0":          {0},
		"truncated key":      p.meta()[:len(p.meta())-1],
		"unknown role":       encodeMeta(nodeMeta{Role: "edge", PubKey: p.pub()}),
		"regional no region": encodeMeta(nodeMeta{Role: RoleRegional, PubKey: p.pub()}),
		"huge length":        {1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"control char":       encodeMeta(nodeMeta{Role: RoleRegional, Region: "a\x00", PubKey: p.pub()}),
	} {
		if _, err := decodeMeta(b); !errors.Is(err, errWire) {
			t.Errorf("%s: err %v, want errWire", name, err)
		}
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	p := newPeer(t, "regional/x", RoleRegional, "x")
	raw := []byte("summary-bytes")
	env := sealEnvelope(p.name, p.priv, raw)
	e, err := decodeEnvelope(env, 100)
	if err != nil {
		t.Fatal(err)
	}
	if e.Sender != p.name || !bytes.Equal(e.Summary, raw) || !bytes.Equal(e.PubKey, p.pub()) || !e.verify(p.pub()) {
		t.Errorf("decoded %+v", e)
	}
	other := newPeer(t, "regional/y", RoleRegional, "y")
	if e.verify(other.pub()) || e.verify(nil) {
		t.Error("verified against the wrong key")
	}
	if _, err := decodeEnvelope(env, len(raw)-1); !errors.Is(err, errOversized) {
		t.Errorf("summary over the cap: %v", err)
	}
	if _, err := decodeEnvelope(append(env, 0), 100); !errors.Is(err, errWire) {
		t.Errorf("trailing byte: %v", err)
	}
	if _, err := decodeEnvelope(sealEnvelope("", p.priv, raw), 100); !errors.Is(err, errWire) {
		t.Errorf("empty sender: %v", err)
	}
	// The signature covers the domain: a bare signature over the body fails.
	body := env[:len(env)-sigLen]
	bare := append(bytes.Clone(body), ed25519.Sign(p.priv, body)...)
	if e, err := decodeEnvelope(bare, 100); err != nil || e.verify(p.pub()) {
		t.Errorf("signature without the domain verified (err %v)", err)
	}
}

func TestStateRoundTrip(t *testing.T) {
	envs := [][]byte{[]byte("a"), {}, bytes.Repeat([]byte("b"), 300)}
	got, err := decodeState(encodeState(envs))
	if err != nil || len(got) != 3 {
		t.Fatalf("got %d entries, err %v", len(got), err)
	}
	for i := range envs {
		if !bytes.Equal(got[i], envs[i]) {
			t.Errorf("entry %d differs", i)
		}
	}
	for name, b := range map[string][]byte{
		"empty":      nil,
		"wrong kind": {kindSummary, 0},
		"too many":   {kindState, 0xff, 0xff, 0x7f},
		"short":      {kindState, 2, 1, 'a'},
		"trailing":   append(encodeState(envs), 9),
	} {
		if _, err := decodeState(b); !errors.Is(err, errWire) {
			t.Errorf("%s: err %v, want errWire", name, err)
		}
	}
}
