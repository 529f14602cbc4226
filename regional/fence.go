package regional

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Fence is the highest routing plan a region has applied: plans below it
// are refused as stale (planTable).
type Fence struct {
	Epoch    uint64 `json:"epoch"`
	Sequence uint64 `json:"sequence"`
}

// FenceStore keeps a region's Fence across controller restarts, so that a
// restarted controller refuses the plans of a leader its predecessor had
// already seen replaced. LoadFence returns the zero Fence and no error when
// nothing was saved. The syncer calls SaveFence after each applied plan,
// from one goroutine.
type FenceStore interface {
	LoadFence() (Fence, error)
	SaveFence(Fence) error
}

// planFenceFile is the FileFence's name in Config.WarmStart.StateDir.
const planFenceFile = "plan-fence.json"

// FileFence is a FenceStore in one small JSON file (written to a temporary
// file in the same directory and renamed over it, so a crash leaves the old
// or the new fence, never half of one).
type FileFence struct{ Path string }

var _ FenceStore = FileFence{}

// LoadFence reads the file; a missing file is the zero Fence.
func (f FileFence) LoadFence() (Fence, error) {
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Fence{}, nil
	}
	if err != nil {
		return Fence{}, fmt.Errorf("regional: plan fence %s: %w", f.Path, err)
	}
	var fe Fence
	if err := json.Unmarshal(b, &fe); err != nil {
		return Fence{}, fmt.Errorf("regional: plan fence %s does not parse (%v): delete it to accept any epoch again", f.Path, err)
	}
	return fe, nil
}

// SaveFence replaces the file.
func (f FileFence) SaveFence(fe Fence) error {
	b, err := json.Marshal(fe)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), filepath.Base(f.Path)+".tmp*")
	if err != nil {
		return fmt.Errorf("regional: plan fence: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("regional: plan fence: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("regional: plan fence: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("regional: plan fence: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("regional: plan fence: %w", err)
	}
	return nil
}

// useFences makes the route keeper keep its fence in st, starting from
// what st holds. Call before the syncer runs.
func (k *routeKeeper) useFences(st FenceStore) error {
	fe, err := st.LoadFence()
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fences = st
	if fe.Epoch > 0 {
		k.fence = &RouteTable{Source: RoutesPlan, Epoch: fe.Epoch, Sequence: fe.Sequence}
	}
	return nil
}
