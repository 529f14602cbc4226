package xdscontract

// Message sizes of the xDS stream, shared by the regional controller (its
// cell cap and its gRPC send limit) and the data planes (their gRPC
// receive limit), so that a data plane takes every snapshot the
// controller admits.

// DefaultMaxCells is the regional controller's default cap on the cells a
// region holds (regional.Limits.MaxCells, --max-cells).
const DefaultMaxCells = 10_000

// EDSBytesPerCell is the budget of one cell in one EDS response: a cell
// appears in its model's main and local clusters and in every context
// class cluster it fits, and in the pinned cluster (and the pinned class
// clusters it fits) of every residency set that allows its region (each
// endpoint ~200 bytes with its metadata). Measured ~1.6 KB per cell with
// 3 context classes and no set; 3 sets add about 2.4 KB. The budget leaves
// 2× of headroom over that for more classes, longer names and addresses.
const EDSBytesPerCell = 8 << 10

// xdsBaseBytes is the part of a response that does not grow with cells
// (clusters, routes, remote localities), and gRPC's own default.
const xdsBaseBytes = 4 << 20

// MaxXDSMessageBytes is the largest xDS response a region of maxCells
// cells can need: the controller's gRPC send limit and a data plane's
// receive limit (about 84 MiB at DefaultMaxCells). maxCells below 1 counts as 1.
func MaxXDSMessageBytes(maxCells int) int {
	return xdsBaseBytes + max(maxCells, 1)*EDSBytesPerCell
}
