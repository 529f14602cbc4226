package paper

// flowQueue will hold the gateway's flow-control queue
// (gateway/flowcontrol) once that package is on main; until then the
// isobar policy answers a saturated arrival 429 like isobar-nocrit.
type flowQueue struct{}

// enqueue queues saturated request i; false: not queued (429).
func (f *fleet) enqueue(int) bool { return false }

// dispatchQueued routes queued requests while an endpoint has room.
func (f *fleet) dispatchQueued() {}

// expireQueued answers the queued requests past their band's age.
func (f *fleet) expireQueued() {}
