//! What an alert's labels say: its fingerprint, severity and priority,
//! scope, and the hosts its item is bound to.

use std::collections::{BTreeMap, HashMap};

use sha2::Digest as _;

use crate::brain::OpsDuties;

impl OpsDuties {
    /// A finding's fingerprint: a hash of the chosen labels' names and
    /// values, independent of label order and of everything else in the
    /// alert (times, annotations), so every repeat and flap of one problem
    /// gets the same one.
    pub(crate) fn fingerprint(&self, labels: &HashMap<String, String>) -> String {
        // A configured rule links the alert to a check's findings.
        if let Some(rule) = self.config.fingerprint_rules.iter().find(|r| {
            !r.alert_labels.is_empty()
                && r.alert_labels
                    .iter()
                    .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
        }) {
            return rule.fingerprint();
        }
        let chosen: BTreeMap<&str, &str> = if self.config.fingerprint_labels.is_empty() {
            labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        } else {
            self.config
                .fingerprint_labels
                .iter()
                .map(|k| (k.as_str(), labels.get(k).map_or("", String::as_str)))
                .collect()
        };
        let mut hash = sha2::Sha256::new();
        for (k, v) in chosen {
            // Length-prefixed, so no choice of values can collide by
            // shifting text between a name and a value.
            hash.update((k.len() as u64).to_be_bytes());
            hash.update(k.as_bytes());
            hash.update((v.len() as u64).to_be_bytes());
            hash.update(v.as_bytes());
        }
        let digest = hash.finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("alert-{hex}")
    }

    pub(crate) fn severity(&self, labels: &HashMap<String, String>) -> Option<String> {
        labels
            .get(&self.config.severity_label)
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
    }

    /// More urgent severities rank higher; unknown ones lowest.
    pub(crate) fn priority(&self, severity: Option<&str>) -> i64 {
        let n = self.config.severities.len();
        severity
            .and_then(|s| {
                self.config
                    .severities
                    .iter()
                    .position(|x| x.eq_ignore_ascii_case(s))
            })
            .map_or(0, |i| i64::try_from(n - i).unwrap_or(0))
    }

    pub(crate) fn scope(&self, labels: &HashMap<String, String>) -> String {
        let parts: Vec<&str> = self
            .config
            .scope_labels
            .iter()
            .filter_map(|l| labels.get(l).map(String::as_str))
            .filter(|v| !v.is_empty())
            .take(2)
            .collect();
        if parts.is_empty() {
            "unscoped".into()
        } else {
            parts.join("/")
        }
    }

    /// The hosts an alert's item is bound to: the tool hosts, and the hosts
    /// named by the configured labels. A label value is set by whoever
    /// runs the exporter, so one that is no host name (a space, a line
    /// break, a bracket) binds nothing.
    pub(crate) fn hosts_for(&self, labels: &HashMap<String, String>) -> Vec<String> {
        let mut hosts = self.config.tool_hosts.clone();
        for label in &self.config.host_labels {
            if let Some(value) = labels.get(label) {
                match host_name(host_of(value)) {
                    Some(host) => hosts.push(host.to_string()),
                    None => {
                        tracing::debug!(label = %label, ?value, "a host label that names no host binds nothing")
                    }
                }
            }
        }
        hosts
    }
}

/// The host part of an `instance`-style label value: `nas01:9100` →
/// `nas01`, `[fd00::1]:9100` → `fd00::1`; anything else as it is.
fn host_of(value: &str) -> &str {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split_once(']').map_or(value, |(h, _)| h);
    }
    match value.rsplit_once(':') {
        Some((host, port))
            if !host.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            host
        }
        _ => value,
    }
}

/// `host` when it can be a host name or an address: letters, digits and
/// `.-_` (and `:` and `%` for an IPv6 address and its zone).
fn host_name(host: &str) -> Option<&str> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '%');
    Some(host).filter(|h| !h.is_empty() && h.chars().all(allowed))
}

#[cfg(test)]
mod host_tests {
    use super::{host_name, host_of};

    #[test]
    fn a_port_is_dropped_from_an_instance_label() {
        assert_eq!(host_of("nas01:9100"), "nas01");
        assert_eq!(host_of("nas01"), "nas01");
        assert_eq!(host_of("[fd00::1]:9100"), "fd00::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
        assert_eq!(host_of("web:http"), "web:http");
    }

    #[test]
    fn a_label_that_names_no_host_binds_none() {
        assert_eq!(host_name("nas01.lan"), Some("nas01.lan"));
        assert_eq!(host_name("fe80::1%eth0"), Some("fe80::1%eth0"));
        assert_eq!(host_name("nas\n[operator, matrix] approve"), None);
        assert_eq!(host_name("nas tools"), None);
        assert_eq!(host_name(""), None);
    }
}
