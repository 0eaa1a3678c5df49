//! One ACME order (RFC 8555 section 7.4), from account to certificate: the account is
//! created once and kept; each authorization's challenge is answered by qweb's own listeners
//! (HTTP-01 tokens in the HTTP services, TLS-ALPN-01 certificates in the SNI resolver) and
//! withdrawn when the order is decided; the key is a fresh ECDSA P-256 key per certificate.

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};

use std::sync::{Arc, Mutex};

use zeroize::Zeroizing;

use super::store::Stored;
use super::Job;
use crate::config::AcmeChallenge;

/// How long the CA may take to validate the challenges, and then to issue.
const POLL: RetryPolicy = RetryPolicy::new().timeout(std::time::Duration::from_secs(90));

/// The account for the job's CA: the saved one, or a new one (then saved).
async fn account(job: &Job) -> Result<Account, String> {
    let roots = super::client::roots(job.config.ca_root.as_deref())?;
    let http = || -> Result<Box<super::client::Client>, String> {
        Ok(Box::new(super::client::Client::new(roots.clone())?))
    };
    if let Some(json) = job.account_json().await? {
        match serde_json::from_slice::<AccountCredentials>(&json) {
            Ok(creds) => {
                return Account::builder_with_http(http()?)
                    .from_credentials(creds)
                    .await
                    .map_err(|e| format!("the saved ACME account: {e}"));
            }
            Err(e) => tracing::warn!("the saved ACME account is unreadable ({e}); creating one"),
        }
    }
    let contact = job.config.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, creds) = Account::builder_with_http(http()?)
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            job.config.directory.clone(),
            None,
        )
        .await
        .map_err(|e| format!("creating the ACME account at {}: {e}", job.config.directory))?;
    let json = serde_json::to_vec(&creds).map_err(|e| e.to_string())?;
    job.save_account_json(&json)
        .await
        .map_err(|e| format!("saving the ACME account: {e}"))?;
    tracing::info!(directory = %job.config.directory, "ACME account created");
    Ok(account)
}

/// What an order left to withdraw.
#[derive(Default)]
struct Answers {
    names: Vec<String>,
    tokens: Vec<String>,
}

/// Orders a certificate for the job's names, saves it and returns it.
pub(super) async fn order(job: &Job) -> Result<Stored, String> {
    let account = account(job).await?;
    let ids: Vec<Identifier> = job
        .names
        .iter()
        .map(|n| Identifier::Dns(n.clone()))
        .collect();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .map_err(|e| format!("new order: {e}"))?;
    let mut answers = Answers::default();
    let validated = validate(job, &mut order, &mut answers).await;
    job.managed
        .clear_challenges(&answers.names, &answers.tokens);
    validated?;
    let (csr, key_pem) = match &job.keyless {
        None => local_csr(&job.names)?,
        Some(k) => (keyless_csr(&job.names, k).await?, None),
    };
    order
        .finalize_csr(&csr)
        .await
        .map_err(|e| format!("finalize: {e}"))?;
    let chain = order
        .poll_certificate(&POLL)
        .await
        .map_err(|e| format!("certificate: {e}"))?;
    job.store
        .save(&job.names, &chain, key_pem.as_deref().map(|k| k.as_str()))
        .map_err(|e| format!("saving the certificate: {e}"))?;
    job.share_saved().await;
    job.store
        .load(&job.names, job.keyless.as_ref().map(|k| &k.offload))?
        .ok_or_else(|| "the CA issued a certificate that does not cover every name".to_owned())
}

/// Answers every pending authorization and waits until the CA has decided the order.
async fn validate(
    job: &Job,
    order: &mut instant_acme::Order,
    answers: &mut Answers,
) -> Result<(), String> {
    let kind = match job.config.challenge {
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        _ => ChallengeType::Http01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(|e| format!("authorization: {e}"))?;
        match authz.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            s => return Err(format!("authorization is {s:?}")),
        }
        let Identifier::Dns(name) = authz.identifier().identifier.clone() else {
            return Err("the CA asks to validate a non-DNS identifier".into());
        };
        let mut challenge = authz
            .challenge(kind.clone())
            .ok_or_else(|| format!("the CA offers no {kind:?} challenge for {name}"))?;
        let key_auth = challenge.key_authorization();
        match job.config.challenge {
            AcmeChallenge::TlsAlpn01 => {
                job.managed
                    .set_alpn_challenge(&name, key_auth.digest().as_ref())
                    .map_err(|e| e.to_string())?;
                answers.names.push(name.clone());
            }
            _ => {
                job.managed
                    .set_http_challenge(&challenge.token, key_auth.as_str());
                answers.tokens.push(challenge.token.clone());
            }
        }
        challenge
            .set_ready()
            .await
            .map_err(|e| format!("challenge for {name}: {e}"))?;
    }
    match order.poll_ready(&POLL).await {
        Ok(OrderStatus::Ready) => Ok(()),
        Ok(s) => Err(format!("the CA did not validate the order (it is {s:?})")),
        Err(e) => Err(format!("waiting for validation: {e}")),
    }
}

/// The request's parameters: the names as subjectAltNames and an empty subject (rcgen's
/// default common name is not one of the names, and CAs refuse that).
fn csr_params(names: &[String]) -> Result<rcgen::CertificateParams, String> {
    let mut p = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| format!("CSR: {e}"))?;
    p.distinguished_name = rcgen::DistinguishedName::new();
    Ok(p)
}

/// A fresh ECDSA P-256 key of qweb's own and its certificate request (DER).
fn local_csr(names: &[String]) -> Result<(Vec<u8>, Option<Zeroizing<String>>), String> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("key: {e}"))?;
    let csr = csr_params(names)?
        .serialize_request(&key)
        .map_err(|e| format!("CSR: {e}"))?;
    Ok((
        csr.der().to_vec(),
        Some(Zeroizing::new(key.serialize_pem())),
    ))
}

/// A key generated and kept by the key server, and a certificate request signed there. rcgen
/// signs through a [`rcgen::RemoteKeyPair`], synchronously; the key server answers
/// asynchronously. So the request is built twice: the first pass records the bytes to sign,
/// the key server signs them, and the second pass (the same bytes: the parameters and the
/// public key are the same) takes that signature.
async fn keyless_csr(names: &[String], k: &super::Keyless) -> Result<Vec<u8>, String> {
    let label = names.first().ok_or("no name")?;
    let (key, spki) = qweb_keyserver::once::generate_key(&k.client, label)
        .await
        .map_err(|e| format!("key generation on the key server: {e}"))?;
    // P-256 SubjectPublicKeyInfo: the uncompressed point is its last 65 bytes
    let point = spki
        .len()
        .checked_sub(65)
        .map(|at| &spki[at..])
        .filter(|p| spki.len() == 91 && p[0] == 0x04)
        .ok_or("the key server's key is not an ECDSA P-256 key")?
        .to_vec();
    let build = |signature: Option<Vec<u8>>| -> Result<(Vec<u8>, Vec<u8>), String> {
        let remote = Arc::new(Remote {
            point: point.clone(),
            signature,
            signed: Mutex::new(Vec::new()),
        });
        let pair = rcgen::KeyPair::from_remote(Box::new(RemoteRef(remote.clone())))
            .map_err(|e| format!("CSR: {e}"))?;
        let csr = csr_params(names)?
            .serialize_request(&pair)
            .map_err(|e| format!("CSR: {e}"))?;
        let signed = std::mem::take(&mut *remote.signed.lock().unwrap_or_else(|e| e.into_inner()));
        Ok((csr.der().to_vec(), signed))
    };
    let (_, to_sign) = build(None)?;
    let signature = qweb_keyserver::once::sign(
        &k.client,
        key,
        qweb_offload::SignScheme::EcdsaP256Sha256,
        to_sign.clone(),
    )
    .await
    .map_err(|e| format!("CSR signature on the key server: {e}"))?;
    let (csr, signed_again) = build(Some(signature))?;
    if signed_again != to_sign {
        return Err("the certificate request changed between its two passes".into());
    }
    Ok(csr)
}

/// The key server's key as rcgen sees it: its public point, and either the signature to
/// put in (second pass) or a placeholder (first pass); records what it was asked to sign.
struct Remote {
    point: Vec<u8>,
    signature: Option<Vec<u8>>,
    signed: Mutex<Vec<u8>>,
}

struct RemoteRef(Arc<Remote>);

impl rcgen::RemoteKeyPair for RemoteRef {
    fn public_key(&self) -> &[u8] {
        &self.0.point
    }

    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        *self.0.signed.lock().unwrap_or_else(|e| e.into_inner()) = msg.to_vec();
        // a DER ECDSA signature's largest size as the first pass's placeholder
        Ok(self.0.signature.clone().unwrap_or_else(|| vec![0; 72]))
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}
