package cycle

import (
	"testing"
	"unsafe"
)

// TestCellViewFitsItsSizeClass: a view is allocated per heartbeat and
// cycle (CellView's doc). On 64-bit platforms it must stay within the
// allocator's 512-byte size class; a field that pushes it past needs a
// place among the small fields, or a reason the view must grow.
func TestCellViewFitsItsSizeClass(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sized for 64-bit platforms")
	}
	if n := unsafe.Sizeof(CellView{}); n > 512 {
		t.Errorf("CellView is %d bytes, past the 512-byte size class (the next is 576)", n)
	}
}
