package gitserver_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/internal/testenv"
)

// rawConn opens a TCP connection to addr from the loopback address from and says
// whether the server greeted it with its version line (a connection over a cap is
// closed before that).
func rawConn(t *testing.T, addr, from string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return c, false
	}
	return c, strings.HasPrefix(line, "SSH-2.0-bex")
}

// dialAs authenticates over x/crypto/ssh with signer, from 127.0.0.1.
func dialAs(addr string, signer gossh.Signer) (*gossh.Client, error) {
	return gossh.Dial("tcp", addr, &gossh.ClientConfig{
		User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second,
	})
}

// TestUnauthenticatedConnectionsAreCappedPerSourceAndInTotal, without a queue
// (MaxUnauthQueued 0): a connection past a cap is closed at once.
func TestUnauthenticatedConnectionsAreCappedPerSourceAndInTotal(t *testing.T) {
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})}, func(c *config) {
		c.MaxUnauthPerSource, c.MaxUnauthConns = 10, 15
		c.MaxUnauthQueuedPerSource, c.MaxUnauthQueued = 0, 0
	})
	admin := e.addUser("admin", appv1.RoleAdmin, false)

	var first net.Conn
	for i := range 10 {
		c, ok := rawConn(t, e.addr, "127.0.0.1")
		if !ok {
			t.Fatalf("connection %d from 127.0.0.1 was refused under the cap", i+1)
		}
		if i == 0 {
			first = c
		}
	}
	start := time.Now()
	if _, ok := rawConn(t, e.addr, "127.0.0.1"); ok {
		t.Fatal("an 11th unauthenticated connection from 127.0.0.1 was greeted")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the 11th connection took %s to be closed, not at once", d)
	}
	// Another source has its own count, up to the total.
	for i := range 5 {
		if _, ok := rawConn(t, e.addr, "127.0.0.2"); !ok {
			t.Fatalf("connection %d from 127.0.0.2 was refused under the caps", i+1)
		}
	}
	if _, ok := rawConn(t, e.addr, "127.0.0.3"); ok {
		t.Fatal("a 16th unauthenticated connection in total was greeted")
	}

	// Control: once one of them leaves, an honest client gets in, and being
	// authenticated it no longer counts: the next raw connection is greeted.
	first.Close()
	var client *gossh.Client
	testenv.Eventually(t, 10*time.Second, "an honest client gets in", func() error {
		var err error
		client, err = dialAs(e.addr, admin.signer)
		return err
	})
	defer client.Close()
	if _, ok := rawConn(t, e.addr, "127.0.0.1"); !ok {
		t.Fatal("an authenticated connection still counts against the cap")
	}
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if out, err := sess.Output("whoami"); err != nil || !strings.Contains(string(out), admin.name) {
		t.Fatalf("honest command: %v %s", err, out)
	}
}

// dialRaw opens a TCP connection to addr from the loopback address from, and
// reads nothing.
func dialRaw(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// state is what became of a raw connection within d: "greeted" (it has a slot:
// the server sent its version), "closed" (refused), or "waiting" (neither: it
// waits in the queue). A connection checked "waiting" may be checked again.
func state(c net.Conn, d time.Duration) string {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := c.Read(b[:])
	switch {
	case n == 1:
		return "greeted"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "waiting"
	}
	return "closed"
}

// dialFrom authenticates over x/crypto/ssh with signer, from the loopback
// address from.
func dialFrom(addr, from string, signer gossh.Signer) (*gossh.Client, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	conn, chans, reqs, err := gossh.NewClientConn(c, addr, &gossh.ClientConfig{
		User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)}, HostKeyCallback: gossh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return gossh.NewClient(conn, chans, reqs), nil
}

// TestUnauthenticatedFloodStaysBounded: a source that holds many connections
// open without authenticating gets its slots (4) and its place in the queue
// (3), and the rest of its connections are closed at once; another source
// still gets a slot; all sources together hold at most the slots (6) and the
// queue (5). A freed slot goes to the first waiter it fits, never to the
// flooding source past its cap; and an honest client from another address,
// arriving when all is full, waits and gets in (the control).
func TestUnauthenticatedFloodStaysBounded(t *testing.T) {
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})}, func(c *config) {
		c.MaxUnauthPerSource, c.MaxUnauthConns = 4, 6
		c.MaxUnauthQueuedPerSource, c.MaxUnauthQueued = 3, 5
		// The test ends every wait and frees every slot itself.
		c.UnauthQueueWait, c.HandshakeTimeout = 2*time.Minute, 2*time.Minute
	})
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	const waitCheck = 300 * time.Millisecond // how long "still waiting" is looked at

	var flood, queued []net.Conn
	for i := range 4 {
		c := dialRaw(t, e.addr, "127.0.0.1")
		if s := state(c, 5*time.Second); s != "greeted" {
			t.Fatalf("flooder's connection %d: %s, want greeted", i+1, s)
		}
		flood = append(flood, c)
	}
	for i := range 3 {
		c := dialRaw(t, e.addr, "127.0.0.1")
		testenv.Eventually(t, 10*time.Second, "the flooder's connection queued", func() error {
			if n := e.srv.UnauthQueued(); n != i+1 {
				return fmt.Errorf("%d queued", n)
			}
			return nil
		})
		queued = append(queued, c)
	}
	start := time.Now()
	if s := state(dialRaw(t, e.addr, "127.0.0.1"), 5*time.Second); s != "closed" || time.Since(start) > time.Second {
		t.Fatalf("the flooder's 8th connection: %s after %s, want closed at once", s, time.Since(start))
	}
	// Another source gets in while the flooder holds all it may.
	var other []net.Conn
	for i := range 2 {
		c := dialRaw(t, e.addr, "127.0.0.2")
		if s := state(c, 5*time.Second); s != "greeted" {
			t.Fatalf("another source's connection %d: %s, want greeted", i+1, s)
		}
		other = append(other, c)
	}
	// The total: 6 slots taken; a third source queues up to the 5 of the queue.
	// One at a time, so that the queue's order is the order of third: the
	// server enqueues each accepted connection on a goroutine of its own.
	var third []net.Conn
	for i := range 2 {
		third = append(third, dialRaw(t, e.addr, "127.0.0.3"))
		testenv.Eventually(t, 10*time.Second, "the third source queued", func() error {
			if n := e.srv.UnauthQueued(); n != 4+i {
				return fmt.Errorf("%d queued", n)
			}
			return nil
		})
	}
	if s := state(dialRaw(t, e.addr, "127.0.0.3"), 5*time.Second); s != "closed" {
		t.Fatalf("past the total queue: %s, want closed", s)
	}
	for _, c := range append(queued, third...) {
		if s := state(c, waitCheck); s != "waiting" {
			t.Fatalf("a queued connection: %s, want waiting", s)
		}
	}

	// A slot of 127.0.0.2 freed: not for the flooder (at its cap), for the
	// third source's first.
	other[0].Close()
	if s := state(third[0], 5*time.Second); s != "greeted" {
		t.Fatalf("the first waiter that fits: %s, want greeted", s)
	}
	if s := state(queued[0], waitCheck); s != "waiting" {
		t.Fatalf("the flooder's waiter, its source at its cap: %s, want waiting", s)
	}
	// A slot of the flooder freed: its own first waiter.
	flood[0].Close()
	if s := state(queued[0], 5*time.Second); s != "greeted" {
		t.Fatalf("the flooder's first waiter once its slot freed: %s", s)
	}

	// The control: an honest client from 127.0.0.4 arrives with every slot
	// taken, waits, and is in once two slots free (the first goes to the third
	// source's other waiter, queued before it).
	type result struct {
		c   *gossh.Client
		err error
	}
	honest := make(chan result, 1)
	queuedBefore := e.srv.UnauthQueued()
	go func() {
		c, err := dialFrom(e.addr, "127.0.0.4", admin.signer)
		honest <- result{c, err}
	}()
	testenv.Eventually(t, 10*time.Second, "the honest client queued", func() error {
		if n := e.srv.UnauthQueued(); n != queuedBefore+1 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	other[1].Close()
	third[0].Close()
	r := <-honest
	if r.err != nil {
		t.Fatalf("the honest client: %v", r.err)
	}
	defer r.c.Close()
	sess, err := r.c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if out, err := sess.Output("whoami"); err != nil || !strings.Contains(string(out), admin.name) {
		t.Fatalf("honest command: %v %s", err, out)
	}
}

// TestABurstFromOneAddressIsServed, with the real ssh client: 20 commands at
// once from 127.0.0.1 while that address's 10 unauthenticated slots are all
// held; they wait in the queue (all 20 of them, seen there), and all succeed
// once the slots free. Then 20 at once with nothing held, as a CI job or a
// team behind one NAT makes them: all succeed.
func TestABurstFromOneAddressIsServed(t *testing.T) {
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})}, func(c *config) {
		// The held connections keep their slots until the test closes them,
		// and the commands wait for them however slowly 20 ssh processes
		// start on a loaded machine.
		c.UnauthQueueWait, c.HandshakeTimeout = 2*time.Minute, 2*time.Minute
	})
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	burst := func() []error {
		errs := make([]error, 20)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				out, err := testenv.SSHCommand(admin.key, "bex", e.addr, "whoami").CombinedOutput()
				if err != nil || !strings.Contains(string(out), admin.name) {
					errs[i] = fmt.Errorf("ssh %d: %v %s", i+1, err, out)
				}
			})
		}
		wg.Wait()
		return errs
	}

	var held []net.Conn
	for i := range gitserver.DefaultConfig().MaxUnauthPerSource {
		c := dialRaw(t, e.addr, "127.0.0.1")
		if s := state(c, 5*time.Second); s != "greeted" {
			t.Fatalf("held connection %d: %s", i+1, s)
		}
		held = append(held, c)
	}
	done := make(chan []error, 1)
	start := time.Now()
	go func() { done <- burst() }()
	testenv.Eventually(t, 60*time.Second, "the 20 ssh commands queued", func() error {
		if n := e.srv.UnauthQueued(); n != 20 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	for _, c := range held {
		c.Close()
	}
	failed := 0
	for _, err := range <-done {
		if err != nil {
			failed++
			t.Error(err)
		}
	}
	t.Logf("20 queued ssh commands: %d failed, %s", failed, time.Since(start))

	start = time.Now()
	failed = 0
	for _, err := range burst() {
		if err != nil {
			failed++
			t.Error(err)
		}
	}
	t.Logf("a burst of 20 ssh commands: %d failed, %s", failed, time.Since(start))
}

func TestASlowHandshakeIsCutAtTheDeadline(t *testing.T) {
	const deadline = 500 * time.Millisecond
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})}, func(c *config) { c.HandshakeTimeout = deadline })
	admin := e.addUser("admin", appv1.RoleAdmin, false)

	// The client sends its version and then the first packet one byte at a time,
	// every 50 ms: always some traffic, so the idle timeout never fires, but the
	// handshake never ends. The pace is the attack, not a wait for an event.
	// The server's deadline runs from its accept, so the clock starts before the
	// dial: started after the greeting, it saw the cut 3 ms early once.
	start := time.Now()
	c, ok := rawConn(t, e.addr, "127.0.0.1")
	if !ok {
		t.Fatal("not greeted")
	}
	if _, err := io.WriteString(c, "SSH-2.0-slow\r\n\x00\x00\x10\x00"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan time.Duration, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, c) // the server's KEXINIT, then EOF when cut
		cut <- time.Since(start)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var took time.Duration
trickle:
	for {
		select {
		case took = <-cut:
			break trickle
		case <-tick.C:
			_, _ = c.Write([]byte{0})
		}
	}
	if took < deadline || took > deadline+2*time.Second {
		t.Fatalf("the trickling client was cut after %s, want about %s", took, deadline)
	}
	t.Logf("trickling client cut after %s (deadline %s)", took, deadline)

	// Control: an authenticated connection outlives the handshake deadline. Here
	// the time passing is what is tested, so the test waits it out.
	client, err := dialAs(e.addr, admin.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	time.Sleep(3 * deadline)
	sess, err := client.NewSession()
	if err != nil {
		t.Fatalf("an authenticated connection was cut at the handshake deadline: %v", err)
	}
	defer sess.Close()
	if out, err := sess.Output("whoami"); err != nil || !strings.Contains(string(out), admin.name) {
		t.Fatalf("honest command: %v %s", err, out)
	}
}

func TestSessionsPerConnectionAreBounded(t *testing.T) {
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})}, func(c *config) { c.MaxSessionsPerConn = 3 })
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	client, err := dialAs(e.addr, admin.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var open []*gossh.Session
	for i := range 3 {
		s, err := client.NewSession()
		if err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		open = append(open, s)
	}
	if s, err := client.NewSession(); err == nil || !strings.Contains(err.Error(), "too many sessions") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("a 4th session on one connection: %v", err)
	}
	// Control: a session that ends gives its place back.
	if out, err := open[0].Output("whoami"); err != nil || !strings.Contains(string(out), admin.name) {
		t.Fatalf("honest command: %v %s", err, out)
	}
	testenv.Eventually(t, 10*time.Second, "a new session after one ended", func() error {
		s, err := client.NewSession()
		if err == nil {
			open = append(open, s)
		}
		return err
	})
	for _, s := range open {
		s.Close()
	}
}

func TestEnvRequestsAreBounded(t *testing.T) {
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})}, func(c *config) {
		c.MaxEnvRequests, c.MaxEnvBytes = 2, 64
	})
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	client, err := dialAs(e.addr, admin.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Setenv("GIT_PROTOCOL", "version=2"); err != nil {
		t.Fatalf("an ordinary env request was refused: %v", err)
	}
	if err := sess.Setenv("BIG", strings.Repeat("x", 100)); err == nil {
		t.Fatal("an env request over MaxEnvBytes was accepted")
	}
	if err := sess.Setenv("THIRD", "1"); err == nil {
		t.Fatal("an env request past MaxEnvRequests was accepted")
	}
	// Control: the session still runs its command.
	if out, err := sess.Output("whoami"); err != nil || !strings.Contains(string(out), admin.name) {
		t.Fatalf("honest command: %v %s", err, out)
	}
}

// switchingKey is a public key that is one key for the client's query ("may I use
// this key?") and another when the client signs: the x/crypto client marshals the
// key twice for the query (request and its answer) and once more for the signed
// request. The signature is then a valid one by the second key, so the server sees
// the query for the first key and a verified signature by the second.
type switchingKey struct {
	gossh.PublicKey // the signing key's, for Type and Verify
	query           gossh.PublicKey
	calls           *int
}

func (k switchingKey) Marshal() []byte {
	*k.calls++
	if *k.calls <= 2 {
		return k.query.Marshal()
	}
	return k.PublicKey.Marshal()
}

// switchingSigner offers query's public key in the query phase and signs with real.
type switchingSigner struct {
	query gossh.PublicKey
	real  gossh.Signer
	calls *int
}

func (s switchingSigner) PublicKey() gossh.PublicKey {
	return switchingKey{PublicKey: s.real.PublicKey(), query: s.query, calls: s.calls}
}

func (s switchingSigner) Sign(r io.Reader, data []byte) (*gossh.Signature, error) {
	return s.real.Sign(r, data)
}

func TestTheUserIsTheOneOfTheKeyThatSigned(t *testing.T) {
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(&echoCommands{})})
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	member := e.addUser("member", appv1.RoleMember, false)
	stranger := e.newKey("stranger") // a key nobody has registered

	// The admin's key in the query, the member's signature: the session is the
	// member's. The server's answer to the query proves it took the admin's key as
	// a candidate, so the test did make the attack.
	calls := 0
	client, err := dialAs(e.addr, switchingSigner{query: admin.signer.PublicKey(), real: member.signer, calls: &calls})
	if err != nil {
		t.Fatalf("a valid signature by the member's key was refused: %v", err)
	}
	defer client.Close()
	if calls < 3 {
		t.Fatalf("the client marshalled the key %d times: the query/sign switch did not happen", calls)
	}
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.Output("whoami")
	sess.Close()
	var got struct{ User, FP string }
	if err != nil || json.Unmarshal(out, &got) != nil {
		t.Fatalf("whoami: %v %s", err, out)
	}
	if got.User != member.name || got.FP != gossh.FingerprintSHA256(member.signer.PublicKey()) {
		t.Fatalf("offering the admin's key and signing with the member's made the session %+v, want %s", got, member.name)
	}

	// The admin's key in the query, a signature by a key nobody registered: refused.
	calls = 0
	if c, err := dialAs(e.addr, switchingSigner{query: admin.signer.PublicKey(), real: stranger.signer, calls: &calls}); err == nil {
		c.Close()
		t.Fatal("a signature by an unregistered key was accepted after the admin's key was queried")
	}
	// soft-serve's maliciousSigner: the admin's public key throughout, signed by the
	// member's private key: refused.
	if c, err := dialAs(e.addr, impostor{offered: admin.signer.PublicKey(), real: member.signer}); err == nil {
		c.Close()
		t.Fatal("the admin's key signed by the member's private key was accepted")
	}
	// Control: the admin's own key is the admin.
	client, err = dialAs(e.addr, admin.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sess, err = client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if out, err := sess.Output("whoami"); err != nil || !bytes.Contains(out, []byte(admin.name)) {
		t.Fatalf("admin: %v %s", err, out)
	}
}
