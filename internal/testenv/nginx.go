package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Nginx is a running nginx (Debian's package), the reference proxy that the edge's
// benchmark measures itself against.
type Nginx struct {
	server
}

// StartNginx runs nginx in the foreground with httpBlock as the body of its http
// {} block, everything else (pid, temp files, logs) kept under dir. It is ready
// when every address in listen accepts connections.
//
// nginx runs as one process (master_process off): the harness's parent-death
// signal reaches only the process it starts, and forked workers would outlive a
// killed test binary.
func StartNginx(dir, httpBlock string, listen ...string) (*Nginx, error) {
	bin, err := Binary("nginx")
	if err != nil {
		// Debian installs it in /usr/sbin, which a non-root PATH may lack.
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			return nil, err
		}
		bin = "/usr/sbin/nginx"
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
	client_body_temp_path %[1]s/client_body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, httpBlock)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	// -t first: a config error is reported as nginx words it, not as a timeout.
	if out, err := exec.Command(bin, "-e", "stderr", "-p", dir, "-c", confPath, "-t", "-q").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nginx -t: %v: %s", err, out)
	}
	// SIGTERM is nginx's fast shutdown.
	srv, err := startServer(dir, "nginx", bin, []string{"-e", "stderr", "-p", dir, "-c", confPath}, nil,
		5*time.Second, 10*time.Second, listen)
	if err != nil {
		return nil, err
	}
	return &Nginx{srv}, nil
}

// processCPUTime is the CPU time (user and system, all threads) that process pid
// has used, from /proc; 0 if it has exited.
func processCPUTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces:
	// state is field 3, utime and stime are fields 14 and 15, in clock ticks.
	rest := string(data[bytes.LastIndexByte(data, ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100
