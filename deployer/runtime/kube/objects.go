package kube

import (
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// Labels this package writes.
const (
	// LabelApp names the App on every object and pod; Delete and the removal of
	// old process types select by it.
	LabelApp = appv1.LabelApp
	// LabelProcess names the process type; with LabelApp it is a Deployment's
	// (immutable) selector and the Service's selector.
	LabelProcess = appv1.LabelProcess
	// LabelRelease is the release number on the pod template. A new release changes
	// the template, which is what makes the Deployment roll.
	LabelRelease = appv1.LabelRelease
	// LabelServingRelease is, on a Deployment, the release whose rollout was
	// last seen complete: the release that serves while a newer one rolls out.
	// It is a label, not an annotation, because the API server bumps a
	// Deployment's generation on any annotation change (annotations are copied to
	// its ReplicaSets): recording the release would make the Deployment look
	// unobserved, hence not ready, right when its rollout completed.
	LabelServingRelease = "app.bex.co/serving-release"
)

// WebProcess is the process type that gets the Service and the readiness probe.
const WebProcess = "web"

// revisionHistoryLimit keeps few old ReplicaSets: bex rolls back by releasing an
// older image, never with `kubectl rollout undo`, so old ReplicaSets are clutter.
const revisionHistoryLimit = 2

// Readiness probe timing. The probe never restarts anything: a pod that is not
// ready just gets no traffic. It is checked often so that a new pod gets traffic
// soon after it answers; the boot timeout is the Deployment's progress deadline
// (see progressDeadline), not a probe threshold.
const (
	probeInitialDelaySeconds = 1
	probePeriodSeconds       = 2
	probeTimeoutSeconds      = 2
	// probeFailureThreshold: a serving pod leaves the endpoints after about 6s of
	// failed checks, not on one slow answer.
	probeFailureThreshold = 3
)

// DeploymentName is the name of the Deployment of one process type of an app.
func DeploymentName(app, process string) string { return app + "-" + process }

// ServiceName is the name of the app's Service, the one the edge routes from.
func ServiceName(app string) string { return app }

// progressDeadline is the boot timeout of d in seconds: the health check's
// bootTimeoutSeconds, else the configured default. It is the Deployment's
// progressDeadlineSeconds: when no new pod becomes available for that long, the
// Deployment controller marks the rollout failed (ProgressDeadlineExceeded), which
// Sync reports as HealthCheckFailed. The old pods keep serving meanwhile.
func progressDeadline(cfg Config, d runtime.Desired) int32 {
	if d.HealthCheck != nil && d.HealthCheck.BootTimeoutSeconds > 0 {
		return d.HealthCheck.BootTimeoutSeconds
	}
	return cfg.ProgressDeadlineSeconds
}

func ownerReference(app *appv1.App) *metav1ac.OwnerReferenceApplyConfiguration {
	kind, name := "App", app.Name
	// A database's one-offs (psql, pg_dump, redis-cli) run as the synthetic
	// App <name>.db with the Database's UID (gitserver/backend's
	// runOnDatabase): no App of that name exists, and the garbage collector
	// would delete a pod owned by one at once. The Database owns them.
	if db := app.Labels[appv1.LabelDatabase]; db != "" && app.Name == appv1.RuntimeName(db) {
		kind, name = "Database", db
	}
	return metav1ac.OwnerReference().
		WithAPIVersion(appv1.GroupVersion.String()).
		WithKind(kind).
		WithName(name).
		WithUID(app.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

// escapeEnvValue makes a literal config value survive Kubernetes' expansion of env
// values, which replaces `$(NAME)` with an earlier variable and `$$` with `$`.
// Config vars are literals (the local runtime passes them as they are), so every `$`
// is doubled. Commands are not escaped: they are written in Kubernetes syntax.
func escapeEnvValue(v string) string { return strings.ReplaceAll(v, "$", "$$") }

// containerEnv is PORT then the config vars. PORT is the runtime's, because the
// probe and the Service point at it: a config var of that name is left out.
func containerEnv(cfg Config, env []appv1.EnvVar) []*corev1ac.EnvVarApplyConfiguration {
	out := []*corev1ac.EnvVarApplyConfiguration{
		corev1ac.EnvVar().WithName("PORT").WithValue(strconv.Itoa(int(cfg.Port))),
	}
	for _, e := range env {
		if e.Name == "PORT" {
			continue
		}
		v := corev1ac.EnvVar().WithName(e.Name)
		if e.ValueFrom != nil {
			v.WithValueFrom(corev1ac.EnvVarSource().WithSecretKeyRef(
				corev1ac.SecretKeySelector().WithName(e.ValueFrom.Name).WithKey(e.ValueFrom.Key)))
		} else {
			v.WithValue(escapeEnvValue(e.Value))
		}
		out = append(out, v)
	}
	return out
}

// readinessProbe checks the web process: GET the health check's path on PORT, or
// else a TCP connection to PORT (the app is up once it listens).
func readinessProbe(cfg Config, hc *appv1.HealthCheck) *corev1ac.ProbeApplyConfiguration {
	p := corev1ac.Probe().
		WithInitialDelaySeconds(probeInitialDelaySeconds).
		WithPeriodSeconds(probePeriodSeconds).
		WithTimeoutSeconds(probeTimeoutSeconds).
		WithSuccessThreshold(1).
		WithFailureThreshold(probeFailureThreshold)
	port := intstr.FromInt32(cfg.Port)
	if hc != nil && hc.Path != "" {
		return p.WithHTTPGet(corev1ac.HTTPGetAction().WithPath(hc.Path).WithPort(port))
	}
	return p.WithTCPSocket(corev1ac.TCPSocketAction().WithPort(port))
}

// replicasOf is how many instances of process d runs: its spec's count, or none
// while the app is suspended (or for a process type d does not have).
func replicasOf(d runtime.Desired, process string) int32 {
	if d.Suspended {
		return 0
	}
	return d.Processes[process].Replicas
}

// processSelector selects the pods of one process type of app: a Deployment's
// (immutable) selector, which its PodDisruptionBudget shares.
func processSelector(app, process string) map[string]string {
	return map[string]string{LabelApp: app, LabelProcess: process}
}

// deployment is the apply configuration of one process type's Deployment. serving is
// the value of LabelServingRelease (0: none yet, left out).
func deployment(cfg Config, d runtime.Desired, process string, serving int64) *appsv1ac.DeploymentApplyConfiguration {
	app := d.App
	spec := d.Processes[process]
	replicas := replicasOf(d, process)
	selector := processSelector(app.Name, process)
	podLabels := map[string]string{LabelApp: app.Name, LabelProcess: process, LabelRelease: strconv.FormatInt(d.Release, 10)}

	c := corev1ac.Container().
		WithName(process).
		WithImage(d.Image).
		WithEnv(containerEnv(cfg, d.Env)...)
	if len(spec.Command) > 0 {
		// `command` replaces the image's entrypoint, as the Procfile's command line
		// does on Heroku. `$(NAME)` references are Kubernetes syntax already.
		c.WithCommand(spec.Command...)
	}
	if process == WebProcess {
		c.WithPorts(corev1ac.ContainerPort().WithName("http").WithContainerPort(cfg.Port).WithProtocol(corev1.ProtocolTCP))
		c.WithReadinessProbe(readinessProbe(cfg, d.HealthCheck))
		if cfg.DrainSeconds > 0 {
			c.WithLifecycle(corev1ac.Lifecycle().WithPreStop(corev1ac.LifecycleHandler().WithSleep(
				corev1ac.SleepAction().WithSeconds(cfg.DrainSeconds))))
		}
	}

	c.WithResources(resources(spec)).WithSecurityContext(securityContext())

	// The mounts before podSpec: it copies the container.
	vols := volumesOf(d.Volumes, process)
	withVolumeMounts(c, vols)
	pod := podSpec(cfg, c).WithTerminationGracePeriodSeconds(cfg.TerminationGracePeriodSeconds)
	withVolumeClaims(pod, app.Name, vols)
	// A process type's instances spread over the nodes, so that the loss of
	// one node leaves the others answering. Soft (ScheduleAnyway): on one node,
	// or with the others full, they still run. Per rollout (the ReplicaSet's
	// pod-template-hash): the new release's pods spread among themselves,
	// whatever the old ones' places. Set whatever the replicas, so that scaling
	// changes no pod template and restarts nothing.
	pod.WithTopologySpreadConstraints(corev1ac.TopologySpreadConstraint().
		WithMaxSkew(1).
		WithTopologyKey(corev1.LabelHostname).
		WithWhenUnsatisfiable(corev1.ScheduleAnyway).
		WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(selector)).
		WithMatchLabelKeys(appsv1.DefaultDeploymentUniqueLabelKey))
	strategy := appsv1ac.DeploymentStrategy().
		WithType("RollingUpdate").
		WithRollingUpdate(appsv1ac.RollingUpdateDeployment().
			WithMaxUnavailable(intstr.FromInt32(0)).
			WithMaxSurge(intstr.FromInt32(cfg.MaxSurge)))
	if len(vols) > 0 {
		// ReadWriteOnce: a new pod scheduled on another node could not attach the
		// volume while the old pod holds it, so the old pods go first.
		strategy = appsv1ac.DeploymentStrategy().WithType("Recreate")
	}

	labels := map[string]string{LabelApp: app.Name, LabelProcess: process}
	if serving > 0 {
		labels[LabelServingRelease] = strconv.FormatInt(serving, 10)
	}
	template := corev1ac.PodTemplateSpec().WithLabels(podLabels).WithSpec(pod)
	if t := d.Restarts[process]; t != "" {
		// A changed pod template is a rollout: ps:restart is `kubectl rollout
		// restart`, which sets an annotation the same way.
		template.WithAnnotations(map[string]string{appv1.RestartedAtAnnotation: t})
	}
	dep := appsv1ac.Deployment(DeploymentName(app.Name, process), app.Namespace).
		WithLabels(labels).
		WithOwnerReferences(ownerReference(app)).
		WithSpec(appsv1ac.DeploymentSpec().
			WithReplicas(replicas).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selector)).
			WithProgressDeadlineSeconds(progressDeadline(cfg, d)).
			WithRevisionHistoryLimit(revisionHistoryLimit).
			WithStrategy(strategy).
			WithTemplate(template))
	return dep
}

// podSpec is what every pod of an app has, process or one-off: its one
// container, its user namespace, no Service links, no API token, the pull secret.
func podSpec(cfg Config, c *corev1ac.ContainerApplyConfiguration) *corev1ac.PodSpecApplyConfiguration {
	pod := corev1ac.PodSpec().
		WithContainers(c).
		WithHostUsers(cfg.HostUsers).
		// Apps get their config vars and nothing else: no FOO_SERVICE_HOST for
		// every Service of the namespace (which could also shadow a config var),
		// and no API token they have no use for.
		WithEnableServiceLinks(false).
		WithAutomountServiceAccountToken(false)
	if cfg.ImagePullSecret != "" {
		pod.WithImagePullSecrets(corev1ac.LocalObjectReference().WithName(cfg.ImagePullSecret))
	}
	return pod
}

// resources are the limits of one instance, as on the local runtime: memory is a
// request and a limit of the same size (the scheduler places the pod where it
// fits; over it the kernel kills the process, OOMKilled); cpu, when set, is a
// request and a limit of that many CPUs (a CFS quota, and the weight that follows
// from the request); without it the pod asks for a tenth of a CPU and is not
// capped, as the local runtime caps nothing then.
func resources(p appv1.ProcessSpec) *corev1ac.ResourceRequirementsApplyConfiguration {
	mem := *resource.NewQuantity(p.MemoryBytes(), resource.BinarySI)
	requests := corev1.ResourceList{corev1.ResourceMemory: mem, corev1.ResourceCPU: resource.MustParse("100m")}
	limits := corev1.ResourceList{corev1.ResourceMemory: mem}
	if m := p.CPUMillis(); m > 0 {
		cpu := *resource.NewMilliQuantity(m, resource.DecimalSI)
		requests[corev1.ResourceCPU] = cpu
		limits[corev1.ResourceCPU] = cpu
	}
	return corev1ac.ResourceRequirements().WithRequests(requests).WithLimits(limits)
}

// securityContext confines an app's container as the local runtime does: the
// runtime's default seccomp profile, every capability dropped but
// runtime.Capabilities, no privilege escalation (no_new_privs). runAsNonRoot is
// not set: images run as root inside their user namespace (hostUsers: false).
func securityContext() *corev1ac.SecurityContextApplyConfiguration {
	add := make([]corev1.Capability, len(runtime.Capabilities))
	for i, c := range runtime.Capabilities {
		add[i] = corev1.Capability(strings.TrimPrefix(c, "CAP_"))
	}
	return corev1ac.SecurityContext().
		WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)).
		WithCapabilities(corev1ac.Capabilities().WithDrop("ALL").WithAdd(add...)).
		WithAllowPrivilegeEscalation(false).
		WithPrivileged(false)
}

// service is the apply configuration of the app's Service: port 80 to PORT of the
// web pods. Its EndpointSlices list the ready web pods, which the edge routes to.
func service(cfg Config, app *appv1.App) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(ServiceName(app.Name), app.Namespace).
		WithLabels(map[string]string{LabelApp: app.Name}).
		WithOwnerReferences(ownerReference(app)).
		WithSpec(corev1ac.ServiceSpec().
			WithSelector(map[string]string{LabelApp: app.Name, LabelProcess: WebProcess}).
			WithPorts(corev1ac.ServicePort().
				WithName("http").
				WithProtocol(corev1.ProtocolTCP).
				WithPort(80).
				WithTargetPort(intstr.FromInt32(cfg.Port))))
}
