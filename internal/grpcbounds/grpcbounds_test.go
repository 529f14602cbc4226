package grpcbounds

import (
	"errors"
	"testing"
	"time"
)

func TestDefaultsCompatible(t *testing.T) {
	if err := ServerCompatible(Server{}, Client{}); err != nil {
		t.Fatalf("the shared defaults disagree: %v", err)
	}
	if got, want := (Client{}).Detection(), 15*time.Second; got != want {
		t.Errorf("default detection bound %v, want %v", got, want)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		err  error
	}{
		{"client below grpc-go's floor", Client{Time: 5 * time.Second}.Validate()},
		{"client negative timeout", Client{Timeout: -time.Second}.Validate()},
		{"server negative", Server{Time: -time.Second}.Validate()},
		{"server stricter than the client", ServerCompatible(Server{MinPingInterval: time.Minute}, Client{})},
	}
	for _, tc := range cases {
		if !errors.Is(tc.err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, tc.err)
		}
	}
	if err := (Client{Time: 10 * time.Second, Timeout: time.Second}).Validate(); err != nil {
		t.Errorf("10 s + 1 s: %v", err)
	}
}
