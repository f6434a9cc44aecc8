//! A certificate manager: keeps one certificate (the client's or the kubelet server's) current by
//! requesting a new one, with a new key, at a jittered 70–90 % of the current one's lifetime,
//! storing it and handing it to whoever presents it (the API clients' transport, the kubelet
//! server's handle). A failed request is retried with a doubling pause (2 s to 32 s, upstream's
//! back-off) and counted; the old certificate stays in use meanwhile.
//!
//! A certificate that does not cover what the manager requests (`template.rs`: the serving
//! certificate kept from the last run lacks one of the node's addresses now, or names another
//! node) is replaced at once rather than at its deadline, as upstream's `nextRotationDeadline`
//! does. Once per request: a certificate issued for the very subject requested is kept until its
//! deadline even if the signer left a name out (upstream would ask again every second).
//!
//! Upstream: client-go `util/certificate/certificate_manager.go` (`Start`, `rotateCerts`,
//! `nextRotationDeadline` with `jitteryDuration`: `wait.Jitter(total, 0.2) - 0.3 × total`, so a
//! deadline in [70 %, 90 %) of the lifetime after NotBefore). Rotation CSRs are named by the
//! API server (`generateName: csr-`), as upstream's manager leaves the name empty.
//! Not here: the first client certificate (`bootstrap.rs`), the requests (`csr.rs`).

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, SystemTime},
};

use kube::Client;
use rcgen::KeyPair;
use tokio_util::sync::CancellationToken;

use super::{
    Error,
    csr::{self, Kind, Subject},
    metrics::CertificateMetrics,
    store::{Pair, Store},
    template::{self, Mismatch},
};
use crate::clock::Clock;

/// How long upstream's manager waits for a rotation CSR (`certificateWaitTimeout`).
const WAIT_TIMEOUT: Duration = Duration::from_secs(15 * 60);
const FIRST_RETRY: Duration = Duration::from_secs(2);
const LAST_RETRY: Duration = Duration::from_secs(32);
/// The longest sleep between looks at the deadline, so a wall clock that jumps is noticed.
const MAX_WAIT: Duration = Duration::from_secs(5 * 60);

/// The rotation deadline of `pair`: NotBefore + (0.7 + 0.2 × `jitter`) × its lifetime, `jitter`
/// in [0, 1).
pub fn rotation_deadline(pair: &Pair, jitter: f64) -> SystemTime {
    let total = pair
        .not_after
        .duration_since(pair.not_before)
        .unwrap_or_default();
    let fraction = 0.7 + 0.2 * jitter.clamp(0.0, 1.0);
    pair.not_before + total.mul_f64(fraction)
}

/// Asks the cluster for a certificate for `key`, and waits for it.
pub trait Requester: Send + Sync + 'static {
    fn request(
        &self,
        kind: Kind,
        subject: &Subject,
        key: &KeyPair,
    ) -> impl Future<Output = Result<Vec<u8>, Error>> + Send;
}

/// Requests through the API server with the agent's client (for a rotation: the current
/// identity; the API server approves a node's renewal of its own client certificate).
#[derive(Clone)]
pub struct ApiRequester {
    pub client: Client,
}

impl Requester for ApiRequester {
    async fn request(
        &self,
        kind: Kind,
        subject: &Subject,
        key: &KeyPair,
    ) -> Result<Vec<u8>, Error> {
        let request = csr::request_pem(subject, key)?;
        let mut object = csr::object("", kind, &request);
        object.metadata.name = None;
        object.metadata.generate_name = Some("csr-".to_owned());
        let name = csr::create_generated(&self.client, &object).await?;
        tracing::info!(
            csr = name,
            signer = kind.signer(),
            "certificate signing request created"
        );
        match tokio::time::timeout(WAIT_TIMEOUT, csr::wait_for_certificate(&self.client, &name))
            .await
        {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                name,
                seconds: WAIT_TIMEOUT.as_secs(),
            }),
        }
    }
}

/// Who takes a new certificate (the transport's identity, the server's handle).
pub type Publish = Box<dyn Fn(&Pair) + Send + Sync>;

/// What one look at the certificate did.
#[derive(Debug)]
pub enum Step {
    /// The current certificate is good until its deadline, this far away.
    Wait(Duration),
    Rotated,
    Failed(Error),
}

pub struct Manager<R> {
    kind: Kind,
    subject: Subject,
    store: Arc<Store>,
    file: &'static str,
    requester: R,
    clock: Clock,
    jitter: Box<dyn Fn() -> f64 + Send + Sync>,
    publish: Vec<Publish>,
    metrics: CertificateMetrics,
    current: Option<Pair>,
    deadline: Option<SystemTime>,
    /// What the current certificate was requested for by this manager; `None` for one it
    /// started with.
    issued_for: Option<Subject>,
}

impl<R: Requester> Manager<R> {
    /// A manager starting from `current` (already in use: not published again).
    #[expect(
        clippy::too_many_arguments,
        reason = "what a manager is for, where it stores and whom it asks: one call at start"
    )]
    pub fn new(
        kind: Kind,
        subject: Subject,
        store: Arc<Store>,
        file: &'static str,
        requester: R,
        clock: Clock,
        metrics: CertificateMetrics,
        current: Option<Pair>,
    ) -> Manager<R> {
        let mut manager = Manager {
            kind,
            subject,
            store,
            file,
            requester,
            clock,
            jitter: Box::new(fastrand::f64),
            publish: Vec::new(),
            metrics,
            current: None,
            deadline: None,
            issued_for: None,
        };
        if let Some(pair) = current {
            manager.adopt(pair, None);
        }
        manager
    }

    /// Replaces the jitter source (tests pin it).
    pub fn with_jitter(mut self, jitter: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.jitter = Box::new(jitter);
        if let Some(pair) = &self.current {
            self.deadline = Some(rotation_deadline(pair, (self.jitter)()));
        }
        self
    }

    pub fn on_rotate(mut self, publish: Publish) -> Self {
        self.publish.push(publish);
        self
    }

    pub fn current(&self) -> Option<&Pair> {
        self.current.as_ref()
    }

    pub fn deadline(&self) -> Option<SystemTime> {
        self.deadline
    }

    fn adopt(&mut self, pair: Pair, issued_for: Option<Subject>) {
        let deadline = rotation_deadline(&pair, (self.jitter)());
        if let Some(mismatch) = template::mismatch(&pair.names, &self.subject) {
            if issued_for.as_ref() == Some(&self.subject) {
                tracing::warn!(
                    certificate = self.kind.name(),
                    serial = pair.serial,
                    %mismatch,
                    "the issued certificate does not cover the request; it stays in use until its rotation deadline"
                );
            } else {
                tracing::info!(
                    certificate = self.kind.name(),
                    serial = pair.serial,
                    %mismatch,
                    "the certificate does not cover what this node requests now; requesting a new one"
                );
            }
        }
        self.metrics.set_not_after(pair.not_after);
        tracing::info!(
            certificate = self.kind.name(),
            serial = pair.serial,
            rotation_in_s = deadline
                .duration_since((self.clock)())
                .unwrap_or_default()
                .as_secs(),
            "certificate in use; rotation deadline set"
        );
        self.deadline = Some(deadline);
        self.current = Some(pair);
        self.issued_for = issued_for;
    }

    /// Why the current certificate is to be replaced before its deadline: it does not cover the
    /// subject, and it was not issued for exactly this subject.
    pub fn replace_early(&self) -> Option<Mismatch> {
        let pair = self.current.as_ref()?;
        if self.issued_for.as_ref() == Some(&self.subject) {
            return None;
        }
        template::mismatch(&pair.names, &self.subject)
    }

    /// Looks at the certificate once: rotates it when there is none or its deadline passed.
    pub async fn step(&mut self) -> Step {
        let now = (self.clock)();
        if let (Some(_), Some(deadline)) = (&self.current, self.deadline)
            && self.replace_early().is_none()
            && let Ok(left) = deadline.duration_since(now)
            && !left.is_zero()
        {
            return Step::Wait(left);
        }
        match self.rotate().await {
            Ok(()) => Step::Rotated,
            Err(error) => {
                self.metrics.renew_errors.inc();
                Step::Failed(error)
            }
        }
    }

    async fn rotate(&mut self) -> Result<(), Error> {
        let key = csr::new_key()?;
        let certificate = self
            .requester
            .request(self.kind, &self.subject, &key)
            .await?;
        let path = self.store.file_path(self.file);
        let pair =
            Pair::from_parts(&certificate, key.serialize_pem().as_bytes(), &path).map_err(|e| {
                Error::BadIssued {
                    name: self.kind.signer().to_owned(),
                    reason: e.to_string(),
                }
            })?;
        self.store.write(self.file, &pair.pem)?;
        for publish in &self.publish {
            publish(&pair);
        }
        self.adopt(pair, Some(self.subject.clone()));
        Ok(())
    }

    /// Keeps the certificate current until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut retry = FIRST_RETRY;
        loop {
            let pause = match self.step().await {
                Step::Wait(left) => left.min(MAX_WAIT),
                Step::Rotated => {
                    retry = FIRST_RETRY;
                    continue;
                }
                Step::Failed(error) => {
                    tracing::warn!(certificate = self.kind.name(), %error, retry_in_s = retry.as_secs(), "renewing the certificate failed");
                    let pause = retry;
                    retry = (retry * 2).min(LAST_RETRY);
                    pause
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::IpAddr,
        sync::{
            Mutex,
            atomic::{AtomicBool, AtomicUsize, Ordering},
        },
    };

    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyUsagePurpose};

    use super::*;

    /// A CA that signs every request for `lifetime` from the fake clock's now, or refuses.
    struct FakeSigner {
        issuer: Issuer<'static, KeyPair>,
        now: Arc<Mutex<SystemTime>>,
        lifetime: Duration,
        refuse: AtomicBool,
        /// Leaves the requested IP addresses out, as a signer with its own policy may.
        drop_ips: AtomicBool,
        requests: AtomicUsize,
    }

    impl Requester for Arc<FakeSigner> {
        async fn request(
            &self,
            kind: Kind,
            subject: &Subject,
            key: &KeyPair,
        ) -> Result<Vec<u8>, Error> {
            self.requests.fetch_add(1, Ordering::SeqCst);
            if self.refuse.load(Ordering::SeqCst) {
                return Err(Error::NotIssued {
                    name: "csr-x".into(),
                    condition: "Denied".into(),
                    reason: "Test".into(),
                    message: kind.signer().into(),
                });
            }
            let mut params = CertificateParams::new(subject.dns_names.clone()).expect("params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, subject.common_name.as_str());
            params.distinguished_name.push(
                rcgen::DnType::OrganizationName,
                subject.organization.as_str(),
            );
            if !self.drop_ips.load(Ordering::SeqCst) {
                params
                    .subject_alt_names
                    .extend(subject.ips.iter().copied().map(rcgen::SanType::IpAddress));
            }
            let now = *self.now.lock().expect("clock");
            let now = time::OffsetDateTime::from(now);
            params.not_before = now;
            params.not_after = now + self.lifetime;
            let cert = params.signed_by(key, &self.issuer).expect("sign");
            Ok(cert.pem().into_bytes())
        }
    }

    fn signer(now: Arc<Mutex<SystemTime>>, lifetime: Duration) -> Arc<FakeSigner> {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        Arc::new(FakeSigner {
            issuer: Issuer::new(params, key),
            now,
            lifetime,
            refuse: AtomicBool::new(false),
            drop_ips: AtomicBool::new(false),
            requests: AtomicUsize::new(0),
        })
    }

    /// The cert dir, the fake clock's time, the signer, the manager, how many certificates it
    /// published, its metrics.
    type Setup = (
        tempfile::TempDir,
        Arc<Mutex<SystemTime>>,
        Arc<FakeSigner>,
        Manager<Arc<FakeSigner>>,
        Arc<AtomicUsize>,
        CertificateMetrics,
    );

    fn setup(jitter: f64) -> Setup {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(&tmp.path().join("pki")).expect("store"));
        // Whole seconds: certificates carry no fractions.
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let now = Arc::new(Mutex::new(start));
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || *clock_now.lock().expect("clock"));
        let signer = signer(now.clone(), Duration::from_secs(1000));
        let metrics = CertificateMetrics::new(Kind::Client, clock.clone()).expect("metrics");
        let published = Arc::new(AtomicUsize::new(0));
        let counter = published.clone();
        let manager = Manager::new(
            Kind::Client,
            Subject::node("n1"),
            store,
            super::super::store::CLIENT_PEM,
            signer.clone(),
            clock,
            metrics.clone(),
            None,
        )
        .with_jitter(move || jitter)
        .on_rotate(Box::new(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        (tmp, now, signer, manager, published, metrics)
    }

    #[test]
    fn the_deadline_is_70_to_90_percent_of_the_lifetime() {
        let pem = super::super::csr::tests::self_signed_pem("c", 3600);
        let pair = Pair::from_pem(pem, std::path::Path::new("t")).expect("pair");
        let total = pair
            .not_after
            .duration_since(pair.not_before)
            .expect("ordered");
        let earliest = rotation_deadline(&pair, 0.0);
        let latest = rotation_deadline(&pair, 0.999_999);
        assert_eq!(earliest, pair.not_before + total.mul_f64(0.7));
        assert!(latest < pair.not_before + total.mul_f64(0.9) + Duration::from_millis(1));
        assert!(latest > pair.not_before + total.mul_f64(0.89));
        for _ in 0..200 {
            let deadline = rotation_deadline(&pair, fastrand::f64());
            assert!(deadline >= earliest && deadline <= latest);
        }
        // Out-of-range jitter stays inside the bounds.
        assert_eq!(rotation_deadline(&pair, -3.0), earliest);
        assert!(rotation_deadline(&pair, 7.0) <= pair.not_before + total.mul_f64(0.9));
    }

    #[tokio::test]
    async fn requests_at_start_waits_until_the_deadline_then_rotates() {
        let (tmp, now, signer, mut manager, published, metrics) = setup(0.5);
        assert!(matches!(manager.step().await, Step::Rotated));
        assert_eq!(published.load(Ordering::SeqCst), 1);
        let first = manager.current().expect("issued").serial.clone();
        let on_disk = std::fs::read(tmp.path().join("pki").join(super::super::store::CLIENT_PEM))
            .expect("stored");
        assert_eq!(on_disk, manager.current().expect("issued").pem);

        // 80 % of 1000 s: the deadline is 800 s away.
        match manager.step().await {
            Step::Wait(left) => assert_eq!(left, Duration::from_secs(800)),
            other => panic!("expected a wait, got {other:?}"),
        }
        assert!(metrics.ttl_seconds() > 999.0);
        *now.lock().expect("clock") += Duration::from_secs(799);
        assert!(matches!(manager.step().await, Step::Wait(_)));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 1);

        *now.lock().expect("clock") += Duration::from_secs(1);
        assert!(matches!(manager.step().await, Step::Rotated));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 2);
        assert_eq!(published.load(Ordering::SeqCst), 2);
        assert_ne!(manager.current().expect("issued").serial, first);
        assert!(matches!(manager.step().await, Step::Wait(_)));
    }

    #[tokio::test]
    async fn a_refused_request_keeps_the_old_certificate_and_counts_an_error() {
        let (_tmp, now, signer, mut manager, published, metrics) = setup(0.0);
        assert!(matches!(manager.step().await, Step::Rotated));
        let serial = manager.current().expect("issued").serial.clone();
        *now.lock().expect("clock") += Duration::from_secs(700);
        signer.refuse.store(true, Ordering::SeqCst);
        assert!(matches!(
            manager.step().await,
            Step::Failed(Error::NotIssued { .. })
        ));
        assert!(matches!(manager.step().await, Step::Failed(_)));
        assert_eq!(metrics.renew_errors.get(), 2);
        assert_eq!(manager.current().expect("kept").serial, serial);
        assert_eq!(published.load(Ordering::SeqCst), 1);

        signer.refuse.store(false, Ordering::SeqCst);
        assert!(matches!(manager.step().await, Step::Rotated));
        assert_ne!(manager.current().expect("issued").serial, serial);
    }

    #[tokio::test]
    async fn a_stored_certificate_is_adopted_without_a_request() {
        let (_tmp, now, signer, mut manager, _published, _metrics) = setup(0.5);
        assert!(matches!(manager.step().await, Step::Rotated));
        let pair = manager.current().expect("issued").clone();
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || *clock_now.lock().expect("clock"));
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(tmp.path()).expect("store"));
        let metrics = CertificateMetrics::new(Kind::Client, clock.clone()).expect("metrics");
        let mut adopted = Manager::new(
            Kind::Client,
            Subject::node("n1"),
            store,
            super::super::store::CLIENT_PEM,
            signer.clone(),
            clock,
            metrics,
            Some(pair),
        )
        .with_jitter(|| 0.5);
        assert!(matches!(adopted.step().await, Step::Wait(_)));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 1);
    }

    /// The serving subject of node n1 at `ip`.
    fn serving(ip: &str) -> Subject {
        Subject {
            dns_names: vec!["n1".to_owned()],
            ips: vec![ip.parse().expect("ip")],
            ..Subject::node("n1")
        }
    }

    /// A serving certificate manager of n1 at `ip`, started with `current`.
    fn serving_manager(
        signer: &Arc<FakeSigner>,
        now: &Arc<Mutex<SystemTime>>,
        ip: &str,
        current: Option<Pair>,
    ) -> (tempfile::TempDir, Manager<Arc<FakeSigner>>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(tmp.path()).expect("store"));
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || *clock_now.lock().expect("clock"));
        let metrics = CertificateMetrics::new(Kind::Serving, clock.clone()).expect("metrics");
        let manager = Manager::new(
            Kind::Serving,
            serving(ip),
            store,
            super::super::store::SERVER_PEM,
            signer.clone(),
            clock,
            metrics,
            current,
        )
        .with_jitter(|| 0.5);
        (tmp, manager)
    }

    fn start() -> (Arc<Mutex<SystemTime>>, Arc<FakeSigner>) {
        let now = Arc::new(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000),
        ));
        let signer = signer(now.clone(), Duration::from_secs(1000));
        (now, signer)
    }

    #[tokio::test]
    async fn a_kept_certificate_without_the_nodes_address_is_replaced_at_once_and_once() {
        let (now, signer) = start();
        // Last run's certificate, for the address the node had then.
        let (_old_dir, mut old) = serving_manager(&signer, &now, "10.0.0.9", None);
        assert!(matches!(old.step().await, Step::Rotated));
        let kept = old.current().expect("issued").clone();

        let (_dir, mut manager) = serving_manager(&signer, &now, "10.0.0.5", Some(kept.clone()));
        assert_eq!(
            manager.replace_early(),
            Some(Mismatch::Ips(vec!["10.0.0.5".parse().expect("ip")]))
        );
        // Long before its deadline, it is replaced at the first look.
        assert!(matches!(manager.step().await, Step::Rotated));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 2);
        let issued = manager.current().expect("issued");
        assert_ne!(issued.serial, kept.serial);
        assert_eq!(
            issued.names.ips,
            ["10.0.0.5".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(manager.replace_early(), None);
        assert!(matches!(manager.step().await, Step::Wait(_)));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 2);

        // Still covering the node's addresses (an extra one does not matter): kept.
        let (_dir, mut covered) = serving_manager(&signer, &now, "10.0.0.9", Some(kept));
        assert_eq!(covered.replace_early(), None);
        assert!(matches!(covered.step().await, Step::Wait(_)));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_replacement_keeps_the_old_certificate_and_is_tried_again() {
        let (now, signer) = start();
        let (_old_dir, mut old) = serving_manager(&signer, &now, "10.0.0.9", None);
        assert!(matches!(old.step().await, Step::Rotated));
        let kept = old.current().expect("issued").clone();
        let (_dir, mut manager) = serving_manager(&signer, &now, "10.0.0.5", Some(kept.clone()));
        signer.refuse.store(true, Ordering::SeqCst);
        // Each look asks again (the run loop's back-off spaces the looks out).
        assert!(matches!(manager.step().await, Step::Failed(_)));
        assert!(matches!(manager.step().await, Step::Failed(_)));
        assert_eq!(manager.current().expect("kept").serial, kept.serial);
        signer.refuse.store(false, Ordering::SeqCst);
        assert!(matches!(manager.step().await, Step::Rotated));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_signer_that_leaves_the_address_out_is_not_asked_again_before_the_deadline() {
        let (now, signer) = start();
        signer.drop_ips.store(true, Ordering::SeqCst);
        let (_dir, mut manager) = serving_manager(&signer, &now, "10.0.0.5", None);
        assert!(matches!(manager.step().await, Step::Rotated));
        assert!(manager.current().expect("issued").names.ips.is_empty());
        assert_eq!(manager.replace_early(), None);
        match manager.step().await {
            Step::Wait(left) => assert_eq!(left, Duration::from_secs(800)),
            other => panic!("expected a wait, got {other:?}"),
        }
        assert_eq!(signer.requests.load(Ordering::SeqCst), 1);
        *now.lock().expect("clock") += Duration::from_secs(800);
        assert!(matches!(manager.step().await, Step::Rotated));
        assert_eq!(signer.requests.load(Ordering::SeqCst), 2);
    }
}
