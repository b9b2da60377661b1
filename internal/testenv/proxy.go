package testenv

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// CutMode is how the proxy cuts the network.
type CutMode int

const (
	// Open forwards everything.
	Open CutMode = iota
	// Blackhole keeps every connection open but delivers nothing in either
	// direction until healed (a partition without resets: the client
	// cannot tell it is cut off). New connections are accepted and held.
	Blackhole
	// Drop closes every connection and every new one at once (the client
	// sees the disconnect and cannot reconnect until healed).
	Drop
)

func (m CutMode) String() string {
	switch m {
	case Open:
		return "open"
	case Blackhole:
		return "blackhole"
	case Drop:
		return "drop"
	}
	return fmt.Sprintf("CutMode(%d)", int(m))
}

// TCPProxy forwards connections from a loopback port to one target address
// and can cut them (blackhole or drop) and heal. Its goroutines (the accept
// loop and two pipes per connection) are owned by it and end at close.
type TCPProxy struct {
	ln     net.Listener
	target string

	mu   sync.Mutex
	mode CutMode
	// changed is closed (and replaced) at every mode change, waking the
	// pipes that hold a chunk.
	changed chan struct{}
	conns   map[net.Conn]struct{}
	closed  bool
	// delay holds each chunk this long before forwarding it (SetDelay).
	delay time.Duration

	done chan struct{}
	wg   sync.WaitGroup
}

// StartProxy listens on 127.0.0.1 and forwards to target; it is closed at
// t's cleanup.
func StartProxy(t testing.TB, target string) *TCPProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &TCPProxy{ln: ln, target: target, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's listening address.
func (p *TCPProxy) Addr() string { return p.ln.Addr().String() }

// Cut changes the mode to Blackhole or Drop.
func (p *TCPProxy) Cut(mode CutMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setMode(mode)
	if mode == Drop {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// Heal forwards again; held bytes of blackholed connections flow on.
func (p *TCPProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setMode(Open)
}

// SetDelay holds every chunk d before it is forwarded, in each direction:
// a slow link (a round trip takes 2d more, and a peer that waits for each
// answer does at most one exchange per 2d on a connection). Zero forwards
// at once.
func (p *TCPProxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = max(d, 0)
}

// setMode changes the mode and wakes waiting pipes; p.mu is held.
func (p *TCPProxy) setMode(m CutMode) {
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *TCPProxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	close(p.done)
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c; it reports false (and closes c) when the proxy is
// closed or dropping.
func (p *TCPProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == Drop {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *TCPProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *TCPProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(client) {
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			p.untrack(client)
			continue
		}
		if !p.track(server) {
			p.untrack(client)
			continue
		}
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// pipe copies src to dst, holding each chunk while the proxy blackholes.
// Either side failing closes both, so the peer pipe ends too.
func (p *TCPProxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer p.untrack(src)
	defer p.untrack(dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() || !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: untrack closes both sides
		}
	}
}

// hold waits the delay (SetDelay) and reports false when the proxy
// closed meanwhile.
func (p *TCPProxy) hold() bool {
	p.mu.Lock()
	d := p.delay
	p.mu.Unlock()
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.done:
		return false
	}
}

// pass waits while the proxy blackholes and reports whether the chunk may
// be forwarded (false once the proxy drops or closes).
func (p *TCPProxy) pass() bool {
	for {
		p.mu.Lock()
		mode, changed := p.mode, p.changed
		p.mu.Unlock()
		switch mode {
		case Open:
			return true
		case Drop:
			return false
		}
		select {
		case <-changed:
		case <-p.done:
			return false
		}
	}
}
