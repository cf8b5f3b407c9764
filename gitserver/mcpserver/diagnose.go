package mcpserver

import (
	"context"
	"fmt"
	"strings"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// Diagnosis is diagnose's result: what is wrong with an app, if anything,
// from everything bex knows of it, in one call.
type Diagnosis struct {
	App   string `json:"app"`
	Phase string `json:"phase" jsonschema:"Pending, Building, Deploying, Running, Failed or Suspended"`
	// Healthy is true when nothing below is a finding.
	Healthy bool `json:"healthy" jsonschema:"true when the newest release serves, no instance is in trouble and the edge saw under 5% 5xx in the last 5 minutes"`
	// ServingRelease serves now; LastRelease is the newest release made.
	ServingRelease int64 `json:"serving_release"`
	LastRelease    int64 `json:"last_release"`
	// Failure is the newest release's, when it never served.
	Failure *DiagnosisFailure `json:"failure,omitempty"`
	// Trouble is what the deployer says of the instances now: CrashLoop,
	// OOMKilled, HealthCheckFailed, ImageNotFound, VolumeFailed (empty: none).
	Trouble        string `json:"trouble,omitempty" jsonschema:"the instances' trouble: CrashLoop (restarts), OOMKilled (over their memory), HealthCheckFailed, ImageNotFound, VolumeFailed; empty: none"`
	TroubleMessage string `json:"trouble_message,omitempty" jsonschema:"the deployer's words, with the app's last lines as untrusted output of the app"`
	// LastBuild is the newest build's result.
	LastBuild *backend.BuildInfo `json:"last_build,omitempty"`
	// Traffic is the edge's figures over the last 5 and 60 minutes, when this
	// server reads them; TrafficUnavailable says why not.
	Traffic            []backend.TrafficWindow `json:"traffic,omitempty"`
	TrafficUnavailable string                  `json:"traffic_unavailable,omitempty"`
	// Domains are the app's own names, served over HTTPS with certificates
	// the edge obtains on their first request.
	Domains []string `json:"domains"`
	// Certificates are the edge's certificates of the app's hosts, when this
	// server reads them; CertificatesUnavailable says why not.
	Certificates            []backend.CertificateState `json:"certificates,omitempty"`
	CertificatesUnavailable string                     `json:"certificates_unavailable,omitempty"`
	// Disk is the server's disk: ok, or why pushes and deploys are refused.
	Disk string `json:"disk" jsonschema:"ok, or what is short (pushes and deploys are refused under the margin), or not measured"`
	// Findings say what is wrong, a sentence each; NextTools what to call.
	Findings  []string `json:"findings"`
	NextTools []string `json:"next_tools" jsonschema:"the tools to call next, most useful first"`
}

// DiagnosisFailure is how the newest release failed.
type DiagnosisFailure struct {
	Release int64  `json:"release"`
	Message string `json:"message" jsonschema:"why it never served, with what the app printed as untrusted output of the app"`
}

// maxErrorRate is the share of 5xx over 5 minutes a diagnosis calls a
// finding.
const maxErrorRate = 0.05

// diagnoseTool is diagnose: the app's releases, instances, requests and disk
// read together, with findings and the tools to call next.
func (s *Server) diagnoseTool() {
	b := s.cfg.Backend
	addTool(s, "diagnose", reads, "Diagnose an app in one call: the serving and the newest release, how the newest failed (its phase and message), the instances' trouble (crash loop, OOM kill, failed health check), the last build, the edge's request count, 5xx rate and p50/p95 latency over 5 and 60 minutes, the state of its hosts' certificates, the server's disk, findings in sentences and the tools to call next."+tailNote,
		func(ctx context.Context, u *backend.User, in AppArg) (Diagnosis, string, error) {
			if err := required(in.App); err != nil {
				return Diagnosis{}, "", err
			}
			st, err := b.App(ctx, u, in.App)
			if err != nil {
				return Diagnosis{}, "", err
			}
			if err := s.maskStatus(ctx, u, st); err != nil {
				return Diagnosis{}, "", err
			}
			d := Diagnosis{App: st.Name, Phase: st.Phase, ServingRelease: st.Revision, LastRelease: st.Release,
				Trouble: st.Trouble, TroubleMessage: st.TroubleMessage, LastBuild: st.LastBuild, Domains: st.Domains, Findings: []string{}}
			if lr := st.LastRelease; lr != nil && lr.Failed != "" {
				d.Failure = &DiagnosisFailure{Release: lr.Number, Message: lr.Failed}
			}
			if m, err := b.Metrics(ctx, u, in.App); err != nil {
				d.TrafficUnavailable = backend.KindOf(err).String() + ": " + err.Error()
			} else {
				d.Traffic = m.Windows
			}
			if certs, err := b.AppCertificates(ctx, u, in.App); err != nil {
				d.CertificatesUnavailable = backend.KindOf(err).String() + ": " + err.Error()
			} else {
				d.Certificates = certs
			}
			d.Disk = "ok"
			if err := b.DiskPressure(); err != nil {
				d.Disk = err.Error()
			}
			d.findings(st)
			text := fmt.Sprintf("%s is %s", d.App, d.Phase)
			if d.Healthy {
				text += fmt.Sprintf(", serving v%d: nothing wrong found.", d.ServingRelease)
			} else {
				text += ": " + strings.Join(d.Findings, " ") + " Next: " + strings.Join(d.NextTools, ", ") + "."
			}
			return d, text, nil
		})
}

// findings fills d's findings, health and next tools from what it holds and
// st.
func (d *Diagnosis) findings(st *backend.AppInfo) {
	next := []string{}
	add := func(tools ...string) {
		for _, t := range tools {
			if !strings.Contains(" "+strings.Join(next, " ")+" ", " "+t+" ") {
				next = append(next, t)
			}
		}
	}
	switch {
	case st.Suspended:
		d.Findings = append(d.Findings, "It is suspended: its processes are stopped and the edge answers 503.")
		add("resume")
	case d.ServingRelease == 0 && d.LastRelease == 0:
		d.Findings = append(d.Findings, "Nothing was deployed yet.")
		add("deploy")
	case d.ServingRelease == 0:
		d.Findings = append(d.Findings, fmt.Sprintf("No release serves: v%d has not come up.", d.LastRelease))
		add("logs", "build_logs")
	}
	if d.Failure != nil {
		d.Findings = append(d.Findings, fmt.Sprintf("Release v%d never served (see failure); v%d serves.", d.Failure.Release, d.ServingRelease))
		add("logs", "releases", "rollback")
	}
	switch d.Trouble {
	case "":
	case appv1.CrashLoopReason:
		d.Findings = append(d.Findings, "Its instances are crash-looping: they exit and are restarted (see trouble_message).")
		add("logs", "releases", "rollback")
	case appv1.OOMKilledReason:
		d.Findings = append(d.Findings, "Its instances were killed for going over their memory limit.")
		add("logs", "scale")
	case appv1.HealthCheckFailedReason:
		d.Findings = append(d.Findings, "Its new instances do not answer their health check on PORT.")
		add("logs", "releases")
	case appv1.SuspendedReason:
	default:
		d.Findings = append(d.Findings, fmt.Sprintf("Its rollout is in trouble: %s.", d.Trouble))
		add("app_status", "logs")
	}
	if lb := d.LastBuild; lb != nil && lb.Result == "failed" {
		d.Findings = append(d.Findings, fmt.Sprintf("Its last build (of %.7s) failed.", lb.Commit))
		add("build_logs")
	}
	if len(d.Traffic) > 0 {
		if w := d.Traffic[0]; w.Requests > 0 && float64(w.Status5xx) > maxErrorRate*float64(w.Requests) {
			d.Findings = append(d.Findings, fmt.Sprintf("%d of its %d requests in the last %d minutes were answered 5xx (%.0f%%).", w.Status5xx, w.Requests, w.Minutes, 100*float64(w.Status5xx)/float64(w.Requests)))
			add("logs", "releases")
		}
	}
	for _, c := range d.Certificates {
		switch c.State {
		case "expired":
			d.Findings = append(d.Findings, fmt.Sprintf("The certificate of %s expired on %s: HTTPS clients refuse it (the edge renews it on a handshake; its logs say why it could not).", c.Host, c.NotAfter))
		case "expiring":
			d.Findings = append(d.Findings, fmt.Sprintf("The certificate of %s is past its renewal time (it ends %s): its renewals are failing.", c.Host, c.NotAfter))
		}
	}
	if d.Disk != "ok" {
		d.Findings = append(d.Findings, "The server's disk is short: "+d.Disk)
	}
	d.Healthy = len(d.Findings) == 0
	if d.Healthy {
		add("logs", "audit")
	}
	d.NextTools = next
}
