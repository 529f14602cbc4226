package regional

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if arg := os.Getenv(deathWatcherEnv); arg != "" {
		os.Exit(deathWatcher(arg))
	}
	goleak.VerifyTestMain(m)
}
