package kube

import (
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// The confinement of an app's pods, for the pods bex runs beside them that
// must be confined the same way (a managed Redis: deployer/databases/cluster).

// ContainerSecurityContext is an app container's security context: seccomp
// RuntimeDefault, capabilities dropped to runtime.Capabilities, no privilege
// escalation.
func ContainerSecurityContext() *corev1ac.SecurityContextApplyConfiguration {
	return securityContext()
}

// PodSpec is the spec of a pod of one container c, as an app's: its own user
// namespace unless cfg.HostUsers, no Service links, no API token, cfg's pull
// secret.
func PodSpec(cfg Config, c *corev1ac.ContainerApplyConfiguration) *corev1ac.PodSpecApplyConfiguration {
	return podSpec(cfg.withDefaults(), c)
}

// Resources are the requests and limits of a container with r, as an app
// process's: memory requested and limited alike, cpu when set.
func Resources(r *appv1.Resources) *corev1ac.ResourceRequirementsApplyConfiguration {
	return resources(appv1.ProcessSpec{Resources: r})
}
