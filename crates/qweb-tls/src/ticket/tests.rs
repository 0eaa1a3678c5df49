use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// How many `TicketKeyMaterial`s this thread zeroized.
    pub(super) static ZEROIZED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn zeroized() -> usize {
    ZEROIZED.with(|n| n.get())
}

/// Key material is wiped when dropped: every copy (a clone too), and `zeroize` leaves
/// neither the name nor the secret.
#[test]
fn ticket_key_material_is_zeroized_when_dropped() {
    fn wiped_on_drop<T: ZeroizeOnDrop>(_: &T) {}
    let mut m = TicketKeyMaterial::random().unwrap();
    wiped_on_drop(&m);
    assert_ne!(m.name, [0; KEY_NAME_LEN]);
    m.zeroize();
    assert_eq!(m.name, [0; KEY_NAME_LEN]);
    assert!(m.secret.is_empty());
    let before = zeroized();
    let a = TicketKeyMaterial::random().unwrap();
    let b = a.clone();
    drop(a);
    assert_eq!(zeroized(), before + 1);
    drop(b);
    assert_eq!(zeroized(), before + 2);
    // a key file's keys and the fleet's keys are the same type
    let file = parse_key_file(&[7; 80]).unwrap();
    let fleet = FleetKeys {
        previous: None,
        current: TicketKeyMaterial::random().unwrap(),
        next: TicketKeyMaterial::random().unwrap(),
        next_in: Duration::from_secs(1),
        current_age: Duration::ZERO,
        rotation: Duration::from_secs(2),
    };
    let before = zeroized();
    drop(file);
    drop(fleet);
    assert_eq!(zeroized(), before + 3);
}

/// However many rotations, a ticketer holds the current key and the previous one, no
/// more; the key material it was made from is dropped (so zeroized) as it goes.
#[test]
fn a_ticketer_holds_at_most_the_current_and_the_previous_key() {
    let (now, clock) = manual();
    let t = Ticketer::local_with_clock(Duration::from_secs(10), clock).unwrap();
    assert_eq!(t.held(), 1);
    let made = zeroized();
    let mut tickets = Vec::new();
    for round in 0..50u64 {
        tickets.push(t.encrypt(b"x").unwrap());
        now.fetch_add(10, Ordering::SeqCst);
        assert_eq!(t.current_key_name().len(), KEY_NAME_LEN);
        assert_eq!(t.held(), 2, "round {round}");
    }
    // one material made and wiped per rotation (Key holds only aws-lc's context)
    assert_eq!(zeroized(), made + 50);
    // only the last ticket's key is still there (as the previous one)
    let (last, older) = tickets.split_last().unwrap();
    assert_eq!(t.decrypt(last).unwrap(), b"x");
    assert!(older.iter().all(|o| t.decrypt(o).is_none()));
}

/// A clock tests move by hand (seconds after the epoch).
fn manual() -> (Arc<AtomicU64>, Clock) {
    let t = Arc::new(AtomicU64::new(1_700_000_000));
    let c = t.clone();
    (
        t,
        Arc::new(move || SystemTime::UNIX_EPOCH + Duration::from_secs(c.load(Ordering::SeqCst))),
    )
}

#[test]
fn roundtrip_and_tamper() {
    let t = Ticketer::local(Duration::from_secs(3600)).unwrap();
    let ticket = t.encrypt(b"session state").unwrap();
    assert_eq!(t.decrypt(&ticket).unwrap(), b"session state");
    // every single-bit flip is refused
    for i in 0..ticket.len() {
        let mut bad = ticket.clone();
        bad[i] ^= 1;
        assert_eq!(t.decrypt(&bad), None, "flip at {i}");
    }
    // truncations, empty, oversized
    for n in 0..ticket.len() {
        assert_eq!(t.decrypt(&ticket[..n]), None, "truncated to {n}");
    }
    assert_eq!(t.decrypt(&vec![0u8; MAX_TICKET + 1]), None);
    // another process's ticketer does not know the key
    let other = Ticketer::local(Duration::from_secs(3600)).unwrap();
    assert_eq!(other.decrypt(&ticket), None);
    assert_eq!(t.lifetime(), 7200);
}

#[test]
fn random_bytes_never_decrypt_or_panic() {
    let t = Ticketer::local(Duration::from_secs(3600)).unwrap();
    let name = t.current_key_name();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..5000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 200) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|i| (seed >> (i % 56)) as u8).collect();
        if round % 2 == 0 && len >= KEY_NAME_LEN {
            // the right key name: reaches the AEAD
            bytes[..KEY_NAME_LEN].copy_from_slice(&name);
        }
        assert_eq!(t.decrypt(&bytes), None);
    }
}

#[test]
fn rotation_keeps_the_previous_key_for_one_period() {
    let (now, clock) = manual();
    let t = Ticketer::local_with_clock(Duration::from_secs(100), clock).unwrap();
    let first = t.encrypt(b"a").unwrap();
    now.fetch_add(99, Ordering::SeqCst);
    assert_eq!(t.decrypt(&first).unwrap(), b"a");
    let k1 = t.current_key_name();
    now.fetch_add(2, Ordering::SeqCst); // 101: rotated once
    assert_ne!(t.current_key_name(), k1);
    assert_eq!(
        t.decrypt(&first).unwrap(),
        b"a",
        "previous key still decrypts"
    );
    let second = t.encrypt(b"b").unwrap();
    now.fetch_add(100, Ordering::SeqCst); // 201: rotated twice
    assert_eq!(t.decrypt(&first), None, "two rotations old: refused");
    assert_eq!(t.decrypt(&second).unwrap(), b"b");
    assert!(t.key_age() < Duration::from_secs(100));
}

#[test]
fn a_long_idle_gap_forgets_every_old_key() {
    let (now, clock) = manual();
    let t = Ticketer::local_with_clock(Duration::from_secs(10), clock).unwrap();
    let old = t.encrypt(b"a").unwrap();
    now.fetch_add(10_000, Ordering::SeqCst);
    assert_eq!(t.decrypt(&old), None);
    let fresh = t.encrypt(b"b").unwrap();
    assert_eq!(t.decrypt(&fresh).unwrap(), b"b");
    assert!(t.key_age() <= Duration::from_secs(10));
}

#[test]
fn key_file_layouts() {
    let mut file = Vec::new();
    for i in 0..2u8 {
        file.extend_from_slice(&[i; 16]);
        file.extend_from_slice(&[i + 10; 64]);
    }
    let keys = parse_key_file(&file).unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[1].name, [1; 16]);
    assert_eq!(parse_key_file(&[7; 48]).unwrap().len(), 1);
    assert_eq!(parse_key_file(&[]), Err(TicketError::FileSize(0)));
    assert_eq!(parse_key_file(&[1; 81]), Err(TicketError::FileSize(81)));
    assert_eq!(parse_key_file(&[1; 160]), Err(TicketError::DuplicateName));
}

#[test]
fn fixed_keys_are_shared_and_survive_one_change() {
    let a = parse_key_file(&[3; 80]).unwrap();
    let mut bfile = vec![4; 16];
    bfile.extend_from_slice(&[5; 64]);
    let b = parse_key_file(&bfile).unwrap();
    let one = Ticketer::fixed(&a, Duration::from_secs(60)).unwrap();
    let two = Ticketer::fixed(&a, Duration::from_secs(60)).unwrap();
    let t = one.encrypt(b"x").unwrap();
    assert_eq!(two.decrypt(&t).unwrap(), b"x", "same file, same keys");
    two.reload_fixed(&b).unwrap();
    assert_eq!(
        two.decrypt(&t).unwrap(),
        b"x",
        "the replaced key still decrypts"
    );
    let t2 = two.encrypt(b"y").unwrap();
    assert_eq!(one.decrypt(&t2), None);
    two.reload_fixed(&a).unwrap();
    two.reload_fixed(&[TicketKeyMaterial::random().unwrap()])
        .unwrap();
    assert_eq!(two.decrypt(&t2), None, "two changes later: gone");
}

#[test]
fn fleet_keys_switch_on_time_without_the_key_server() {
    let (now, clock) = manual();
    let k = |b: u8| TicketKeyMaterial {
        name: [b; 16],
        secret: vec![b; 32],
    };
    let fleet = FleetKeys {
        previous: Some(k(1)),
        current: k(2),
        next: k(3),
        next_in: Duration::from_secs(50),
        current_age: Duration::from_secs(50),
        rotation: Duration::from_secs(100),
    };
    let a = Ticketer::local_with_clock(Duration::from_secs(100), clock.clone()).unwrap();
    let b = Ticketer::local_with_clock(Duration::from_secs(100), clock).unwrap();
    a.install_fleet(&fleet).unwrap();
    b.install_fleet(&fleet).unwrap();
    assert_eq!(a.key_age(), Duration::from_secs(50));
    let t = a.encrypt(b"s").unwrap();
    assert_eq!(b.decrypt(&t).unwrap(), b"s");
    now.fetch_add(51, Ordering::SeqCst);
    assert_eq!(a.current_key_name(), [3; 16], "next took over on time");
    assert_eq!(
        b.decrypt(&t).unwrap(),
        b"s",
        "the old current is now previous"
    );
    let t3 = a.encrypt(b"z").unwrap();
    assert_eq!(b.decrypt(&t3).unwrap(), b"z", "key 3 is the fleet's");
}

/// The key server is never heard from again: the fleet's keys still retire by their age
/// (two periods after each started encrypting), local keys take over, and no more than
/// the current and the previous key are held.
#[test]
fn fleet_keys_retire_by_age_without_the_key_server() {
    let (now, clock) = manual();
    let k = |b: u8| TicketKeyMaterial {
        name: [b; 16],
        secret: vec![b; 32],
    };
    let fleet = FleetKeys {
        previous: Some(k(1)),
        current: k(2),
        next: k(3),
        next_in: Duration::from_secs(50),
        current_age: Duration::from_secs(50),
        rotation: Duration::from_secs(100),
    };
    // the listener's own period (local keys) differs from the fleet's
    let a = Ticketer::local_with_clock(Duration::from_secs(1000), clock.clone()).unwrap();
    let b = Ticketer::local_with_clock(Duration::from_secs(1000), clock).unwrap();
    a.install_fleet(&fleet).unwrap();
    b.install_fleet(&fleet).unwrap();
    assert_eq!(a.held(), 3, "previous, current, next");
    let t2 = a.encrypt(b"s").unwrap(); // key 2, encrypting since -50
    now.fetch_add(60, Ordering::SeqCst); // 60: key 3 encrypts (since 50)
    let t3 = a.encrypt(b"z").unwrap();
    assert_eq!(a.current_key_name(), [3; 16]);
    assert_eq!(b.decrypt(&t2).unwrap(), b"s");
    assert_eq!(a.held(), 2, "key 1 is gone");
    now.fetch_add(89, Ordering::SeqCst); // 149: key 2 is 199 s old
    assert_eq!(b.decrypt(&t2).unwrap(), b"s");
    now.fetch_add(2, Ordering::SeqCst); // 151: key 2 is past two periods
    assert_eq!(a.decrypt(&t2), None, "key 2 retired without the key server");
    assert_eq!(b.decrypt(&t2), None);
    let local = a.current_key_name();
    assert!(![[1; 16], [2; 16], [3; 16]].contains(&local), "a local key");
    assert_ne!(local, b.current_key_name(), "not shared");
    assert_eq!(a.held(), 2, "current (local) and previous (key 3)");
    assert_eq!(
        b.decrypt(&t3).unwrap(),
        b"z",
        "key 3 decrypts one period more"
    );
    let tl = a.encrypt(b"l").unwrap();
    assert_eq!(a.decrypt(&tl).unwrap(), b"l");
    assert_eq!(b.decrypt(&tl), None);
    now.fetch_add(100, Ordering::SeqCst); // 251: key 3 is past two periods
    assert_eq!(b.decrypt(&t3), None);
    assert_eq!(a.decrypt(&t3), None);
    // the local keys rotate at the fleet's period (not the ticketer's 1000 s)
    assert_eq!(a.decrypt(&tl).unwrap(), b"l", "previous local key");
    assert_eq!(a.held(), 2);
    now.fetch_add(100, Ordering::SeqCst); // 351
    assert_eq!(a.decrypt(&tl), None);
    assert_eq!(a.held(), 2);
    now.fetch_add(10_000, Ordering::SeqCst); // idle: everything new
    assert!(a.key_age() < Duration::from_secs(100));
    assert_eq!(a.held(), 1);
    // the key server answers again: the fleet's keys are back
    a.install_fleet(&FleetKeys {
        previous: Some(k(4)),
        current: k(5),
        next: k(6),
        next_in: Duration::from_secs(10),
        current_age: Duration::from_secs(90),
        rotation: Duration::from_secs(100),
    })
    .unwrap();
    assert_eq!(a.current_key_name(), [5; 16]);
    assert_eq!(a.held(), 3);
}
