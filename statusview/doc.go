// Package statusview reads the fleet's live state from the controllers'
// debug HTTP APIs and renders it for a terminal: the client and the
// tables behind `isobar status`, and the route formatting the lab's live
// view shares.
//
// It owns:
//
//   - the addresses: ParseSource turns host:port or http(s)://host:port
//     into a Source;
//   - the client: Fetcher.Collect reads GET /debug/cells and GET
//     /debug/routes of each regional controller and GET /debug/regions
//     and GET /debug/plan of each global member into a Report, decoding
//     the debug API's own types (debugapi.CellDebug, debugapi.RouteTable,
//     debugapi.RegionStatus, the routing plan as protojson). A source that
//     cannot be reached, answers an HTTP error, something other than JSON
//     or more than MaxBody bytes is recorded in its place with an error
//     naming the URL, never returned; Report.Failed counts them;
//   - the rendering: WriteTable prints a Report as tables, one section
//     per source; RoutesSummary and Shares format a debugapi.RouteTable.
//     Every string that came from a source passes through Text, so no
//     control character reaches the terminal.
//
// It does not own the command line, the refresh loop or the choice of
// output format: cmd/isobar does.
//
// # Concurrency
//
// A Fetcher holds no state besides its configuration and may be used by
// any number of goroutines at once. Collect reads every source on a
// goroutine of its own (a source's two requests one after the other) and
// joins them all before it returns; each request is bounded by the
// Fetcher's Timeout and by ctx. The rendering functions are pure: they
// read their arguments only and write to the io.Writer they are given.
// There is no package state.
package statusview
