// Package wan emulates the wide-area paths between the lab's regions, which
// all run in one process on loopback: an L4 proxy per path and protocol
// adds one-way delay and jitter, changeable at run time, and can cut the
// path or reset its connections. It is the lab's counterpart of etcd's
// pkg/proxy and integration bridge.
//
// What it owns:
//   - Proxy (New): a TCP path. Each accepted connection gets its own dial
//     of Config.Target and two delay lines, one per direction.
//   - UDPProxy (NewUDP): a UDP path. Each client address gets a session (a
//     socket connected to the target) and two delay lines; answers go back
//     to the client from the listening socket. Sessions close after
//     Config.SessionIdle without traffic.
//   - Path (NewPath): a Proxy and a UDPProxy on one port, driven together.
//   - Transport: a memberlist transport wrapper that sends each peer's
//     packets and streams through the path to that peer.
//   - The isobar_wan_* metrics, labelled path, proto (tcp, udp) and, where
//     it applies, direction (forward: towards Target; reverse: back).
//
// Delay and jitter. A chunk (one read from a socket, at most
// Config.ChunkSize bytes; for UDP one datagram) read at t is written at
// t + Delay + U, U uniform on [-Jitter, +Jitter] (clipped so the total is
// not negative), drawn from a generator seeded by Config.Seed and the
// connection's sequence number and direction, but never before the chunk
// read before it in the same direction: jitter spreads delivery times but
// never reorders bytes of a stream (nor datagrams of a session). This is
// what a TCP receiver sees on a path with packet-level jitter: a late
// segment holds back the ones behind it. A round trip through a path
// therefore takes 2×Delay more, and its spread is the jitter's plus
// head-of-line holding. SetDelay applies to chunks read after the call;
// chunks already queued keep their times (so a lowered delay shows once the
// queued ones are out). Delay and Jitter are at most MaxDelay.
//
// Partition. TCP: bytes of open connections are held, not delivered (the
// line fills, then reading stops and the sender feels back-pressure); a
// connection accepted while cut is accepted, its bytes held, and the dial
// of the target waits for the heal, so the far end sees nothing. On heal
// everything held goes out, each chunk at max(its due time, now), in
// order. Nothing is closed by the proxy: endpoints' own timeouts (gRPC
// keepalive, request deadlines) decide whether they give up. UDP: every
// datagram is dropped while cut, including those queued whose time comes
// during the cut (counted with reason partition). Reset closes every open
// TCP connection with RST on both sides (UDP: every session) and drops what
// their lines hold; the path keeps accepting.
//
// Memberlist. memberlist probes over UDP and reports an RTT
// (PingDelegate) only for a direct UDP ack that arrives within its
// ProbeTimeout. Gossip between regions therefore needs a Path (a Proxy and
// a UDPProxy on one port) per direction of each region pair, and Transport
// to route each peer through its path; a probe's RTT is then
// delay(a→b) + delay(b→a) plus 1-5 ms. Measured with regional/gossip's
// local timing, probe every 250 ms, ack timeout 150 ms
// (TestMemberlistRTTNeedsUDPPath): with TCP paths only, members stay alive
// through memberlist's TCP fallback ping but no RTT is ever reported; with
// a round trip above the ack timeout the late ack keeps the peer alive but
// again no RTT is reported; above the probe interval the peer is
// suspected. Keep emulated inter-region round trips below the gossip
// ProbeTimeout.
//
// Concurrency model. New/NewUDP bind the socket; Start launches the owner
// goroutines; Stop cancels them, closes the socket and every connection or
// session, and blocks until every goroutine has exited. A TCP proxy runs
// one accept goroutine and, per connection, a serve goroutine that owns
// four pipe goroutines (a reader and a writer per direction) and joins
// them before it returns; the reader stamps and queues chunks, the writer
// waits on Deps.Clock for each chunk's due time and writes. A UDP proxy
// runs a receive goroutine, an idle sweep on Deps.Clock and three
// goroutines per session. The delay, jitter and partition state is shared
// by a path's connections under one mutex; a partition change wakes every
// waiting writer through a channel closed on each change. Every method is
// safe for concurrent use.
package wan
