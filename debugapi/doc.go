// Package debugapi is the contract of the controllers' debug HTTP APIs:
// the JSON shapes regional serves on /debug/cells and /debug/routes and
// global on /debug/regions. regional and global produce these types;
// statusview (isobar status) consumes them, importing only this package,
// not the controllers.
//
// It is a leaf: types and constants only, no behaviour, no state, so
// there is nothing concurrent in it.
package debugapi
