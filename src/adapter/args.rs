//! The one argument parser: a cursor over a command's arguments that reads
//! keys, integers, durations and option words, and whose [`Cursor::finish`]
//! rejects anything left over. It is generic over the argument type so the
//! same code parses Redis strings in the server and `&str` in tests.

use super::errors::ArgError;

/// A cursor over `args` (argument 0 is the command name).
pub struct Cursor<'a, A> {
    args: &'a [A],
    pos: usize,
    command: &'static str,
}

impl<'a, A: AsRef<[u8]>> Cursor<'a, A> {
    /// A cursor at the first argument after the command name.
    pub fn new(command: &'static str, args: &'a [A]) -> Self {
        Cursor {
            args,
            pos: 1,
            command,
        }
    }

    /// A cursor after a subcommand's name (`RL.BOX STATUS ...`): Redis
    /// has already routed the call by that word.
    pub fn after_subcommand(command: &'static str, args: &'a [A]) -> Self {
        Cursor {
            args,
            pos: 2,
            command,
        }
    }

    /// The name of the command, for error texts.
    pub fn command(&self) -> &'static str {
        self.command
    }

    #[inline(always)]
    fn next(&mut self, what: &'static str) -> Result<&'a [u8], ArgError> {
        match self.args.get(self.pos) {
            Some(arg) => {
                self.pos += 1;
                Ok(arg.as_ref())
            }
            None => Err(self.missing(what)),
        }
    }

    #[cold]
    fn missing(&self, what: &'static str) -> ArgError {
        ArgError::Missing {
            command: self.command,
            what,
        }
    }

    /// A key: returns its position in the argument list (its bytes are
    /// not read here: reading a Redis string's costs a call into Redis).
    pub fn key(&mut self, what: &'static str) -> Result<usize, ArgError> {
        if self.pos >= self.args.len() {
            return Err(self.missing(what));
        }
        self.pos += 1;
        Ok(self.pos - 1)
    }

    /// A whole number in `min..=max`.
    #[inline(always)]
    pub fn integer(&mut self, what: &'static str, min: u64, max: u64) -> Result<u64, ArgError> {
        let bytes = self.next(what)?;
        match parse_integer(bytes) {
            Some(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(integer_error(what, min, max)),
        }
    }

    /// A duration in seconds, returned in milliseconds.
    #[inline(always)]
    pub fn duration_ms(&mut self, what: &'static str, zero_allowed: bool) -> Result<u64, ArgError> {
        let bytes = self.next(what)?;
        match parse_duration_ms(bytes) {
            Some(ms) if zero_allowed || ms > 0 => Ok(ms),
            _ => Err(duration_error(what, zero_allowed)),
        }
    }

    /// The next argument as a word (an option or subcommand), if any.
    pub fn word(&mut self) -> Option<&'a [u8]> {
        let arg = self.args.get(self.pos)?;
        self.pos += 1;
        Some(arg.as_ref())
    }

    /// Whether arguments are left to read.
    pub fn has_more(&self) -> bool {
        self.pos < self.args.len()
    }

    /// The raw bytes of the argument at `pos`.
    pub fn bytes_at(&self, pos: usize) -> &'a [u8] {
        self.args.get(pos).map_or(&[], |a| a.as_ref())
    }

    /// Ok when every argument has been read.
    pub fn finish(&self) -> Result<(), ArgError> {
        if self.has_more() {
            Err(ArgError::Extra {
                command: self.command,
            })
        } else {
            Ok(())
        }
    }
}

#[cold]
fn integer_error(what: &'static str, min: u64, max: u64) -> ArgError {
    ArgError::Integer { what, min, max }
}

#[cold]
fn duration_error(what: &'static str, zero_allowed: bool) -> ArgError {
    ArgError::Duration { what, zero_allowed }
}

/// Set an option that may be given once.
pub fn set_once<T>(slot: &mut Option<T>, option: &'static str, value: T) -> Result<(), ArgError> {
    if slot.is_some() {
        return Err(ArgError::Repeated { option });
    }
    *slot = Some(value);
    Ok(())
}

/// Whether `word` is `keyword`, ignoring ASCII case (as
/// `eq_ignore_ascii_case`, in fewer steps: a letter of the keyword also
/// matches itself with the case bit flipped, anything else only itself).
#[inline]
pub fn is(word: &[u8], keyword: &str) -> bool {
    let keyword = keyword.as_bytes();
    word.len() == keyword.len()
        && word
            .iter()
            .zip(keyword)
            .all(|(&w, &k)| w == k || (k.is_ascii_alphabetic() && w ^ k == 0x20))
}

/// A plain unsigned decimal integer: ASCII digits only, no sign, no
/// spaces, no overflow.
#[inline(always)]
pub fn parse_integer(bytes: &[u8]) -> Option<u64> {
    match bytes.len() {
        // At most 19 digits cannot overflow: no check per digit.
        1..=19 => {
            let mut value = 0u64;
            let mut chunks = bytes.chunks_exact(8);
            for chunk in &mut chunks {
                value = value * 100_000_000 + eight_digits(chunk)?;
            }
            for &b in chunks.remainder() {
                let digit = b.wrapping_sub(b'0');
                if digit > 9 {
                    return None;
                }
                value = value * 10 + u64::from(digit);
            }
            Some(value)
        }
        20 => parse_integer_checked(bytes),
        _ => None,
    }
}

/// Eight ASCII digits (`None` if any byte is not one) as their number, in
/// a few steps on one 64-bit word (the first digit in its lowest byte).
#[inline(always)]
fn eight_digits(chunk: &[u8]) -> Option<u64> {
    let word = u64::from_le_bytes(chunk.try_into().ok()?);
    const HIGH: u64 = 0xf0f0_f0f0_f0f0_f0f0;
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    // Each byte is 0x30..=0x39: its high nibble is 3, and still 3 with 6
    // added (no byte carries into the next: each is below 0x40).
    if word & HIGH != ZEROS || (word + 0x0606_0606_0606_0606) & HIGH != ZEROS {
        return None;
    }
    let digits = word - ZEROS;
    // Pairs, then fours, then all eight: each step joins neighbours, the
    // lower byte (the earlier digit) the more significant.
    let pairs = (digits * 10 + (digits >> 8)) & 0x00ff_00ff_00ff_00ff;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_ffff_0000_ffff;
    Some((fours * 10_000 + (fours >> 32)) & 0xffff_ffff)
}

/// [`parse_integer`] for 20 digits, where `u64` may overflow.
#[cold]
fn parse_integer_checked(bytes: &[u8]) -> Option<u64> {
    bytes.iter().try_fold(0u64, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Seconds as a plain decimal (`60`, `0.25`, `1.5`), with at most
/// millisecond precision (more decimals are accepted only when they are
/// zeros), returned in milliseconds, at most
/// [`crate::core::limits::MAX_DURATION_MS`]. The whole seconds have 1 to
/// 20 digits, as [`parse_integer`]. One pass, no allocation.
#[inline(always)]
pub fn parse_duration_ms(bytes: &[u8]) -> Option<u64> {
    // The whole seconds, up to the first byte that is not a digit (the
    // value wraps past 19 digits: then it is read again, checked).
    let mut seconds = 0u64;
    let mut digits = 0usize;
    for &b in bytes {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        seconds = seconds.wrapping_mul(10).wrapping_add(u64::from(digit));
        digits += 1;
    }
    match digits {
        0 => return None,
        1..=19 => {}
        20 => seconds = parse_integer_checked(bytes.get(..20)?)?,
        _ => return None,
    }
    let ms = match bytes.get(digits) {
        None => 0,
        Some(b'.') => parse_fraction_ms(bytes.get(digits + 1..)?)?,
        Some(_) => return None,
    };
    seconds
        .checked_mul(1000)?
        .checked_add(ms)
        .filter(|&v| v <= crate::core::limits::MAX_DURATION_MS)
}

/// The digits after a duration's dot, in milliseconds: at least one
/// digit, and any beyond the third zeros.
fn parse_fraction_ms(fraction: &[u8]) -> Option<u64> {
    if fraction.is_empty() {
        return None;
    }
    let mut ms = 0u64;
    for (i, &b) in fraction.iter().enumerate() {
        let digit = b.wrapping_sub(b'0');
        match i {
            _ if digit > 9 => return None,
            0..=2 => ms = ms * 10 + u64::from(digit),
            _ if digit != 0 => return None,
            _ => {}
        }
    }
    for _ in fraction.len()..3 {
        ms *= 10;
    }
    Some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"3000"), Some(3000));
        assert_eq!(parse_integer(b"18446744073709551615"), Some(u64::MAX));
        // Eight digits a step: every length, and a bad byte anywhere.
        let digits = b"9876543210123456789";
        for len in 1..=digits.len() {
            let text = std::str::from_utf8(&digits[..len]).expect("ascii");
            assert_eq!(parse_integer(&digits[..len]), text.parse().ok(), "{text}");
            for at in 0..len {
                for bad in [b'/', b':', b'a', b' ', 0x80, 0xb0, 0x00, b'0' + 0x40] {
                    let mut wrong = digits[..len].to_vec();
                    wrong[at] = bad;
                    assert_eq!(parse_integer(&wrong), None, "{text} with {bad} at {at}");
                }
            }
        }
        assert_eq!(parse_integer(b"00000000"), Some(0));
        assert_eq!(parse_integer(b"99999999"), Some(99_999_999));
        assert_eq!(
            parse_integer(b"1000000000000000"),
            Some(1_000_000_000_000_000)
        );
        for bad in [
            "",
            "-1",
            "+1",
            " 1",
            "1 ",
            "1.0",
            "1e3",
            "18446744073709551616",
            "nan",
            "0x10",
        ] {
            assert_eq!(parse_integer(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms(b"60"), Some(60_000));
        assert_eq!(parse_duration_ms(b"0.25"), Some(250));
        assert_eq!(parse_duration_ms(b"0.001"), Some(1));
        assert_eq!(parse_duration_ms(b"1.5000"), Some(1500));
        assert_eq!(parse_duration_ms(b"0"), Some(0));
        assert_eq!(parse_duration_ms(b"2.1"), Some(2100));
        assert_eq!(parse_duration_ms(b"2.12"), Some(2120));
        assert_eq!(parse_duration_ms(b"3153600000"), Some(3_153_600_000_000));
        assert_eq!(parse_duration_ms(b"0.000"), Some(0));
        for bad in [
            "",
            ".5",
            "5.",
            "0.0001",
            "-1",
            "1e3",
            "inf",
            "nan",
            "1.2.3",
            "1.a",
            "1.-5",
            "1.5a",
            "1.0001",
            "a.5",
            ".",
            "3153600001",
            "99999999999999999999",
        ] {
            assert_eq!(parse_duration_ms(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn cursor_reads_and_finishes() {
        let args = ["RL.X", "k", "5", "0.5", "EXTRA"];
        let mut c = Cursor::new("rl.x", &args[..]);
        assert_eq!(c.key("key"), Ok(1));
        assert_eq!(c.integer("n", 1, 10), Ok(5));
        assert_eq!(c.duration_ms("d", false), Ok(500));
        assert_eq!(c.finish(), Err(ArgError::Extra { command: "rl.x" }));
        assert_eq!(c.word(), Some(&b"EXTRA"[..]));
        assert_eq!(c.finish(), Ok(()));
        assert_eq!(
            c.integer("n", 1, 10),
            Err(ArgError::Missing {
                command: "rl.x",
                what: "n"
            })
        );
    }

    /// What the numbers mean, said the slow way: digits read as text into
    /// `u128`, the fraction padded to milliseconds.
    fn reference_duration_ms(text: &str) -> Option<u64> {
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let (whole, fraction) = match text.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (text, None),
        };
        if !all_digits(whole) || whole.len() > 20 {
            return None;
        }
        let mut ms = whole.parse::<u128>().ok()? * 1000;
        if let Some(f) = fraction {
            if !all_digits(f) || f.bytes().skip(3).any(|b| b != b'0') {
                return None;
            }
            let padded = format!("{:0<3}", &f[..f.len().min(3)]);
            ms += padded.parse::<u128>().ok()?;
        }
        let max = u128::from(crate::core::limits::MAX_DURATION_MS);
        u64::try_from(ms).ok().filter(|_| ms <= max)
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 2000,
            failure_persistence: None,
            ..Default::default()
        })]

        /// The one-pass parsers agree with the slow reading on any text of
        /// digits, dots and a few other bytes, and on 20-digit numbers
        /// around `u64::MAX`.
        #[test]
        fn numbers_agree_with_a_slow_reading(
            text in "[0-9.a+-]{0,24}|[cCoOsStT@Aa+.5\x0b-]{2,4}",
            decimal in "[0-9]{1,21}(\\.[0-9]{0,5})?",
            big in (u64::MAX - 1000)..=u64::MAX,
            over in 0u64..1000,
        ) {
            proptest::prop_assert_eq!(parse_duration_ms(text.as_bytes()), reference_duration_ms(&text));
            for keyword in ["COST", "A+", "0.5", "a-b"] {
                proptest::prop_assert_eq!(is(text.as_bytes(), keyword), text.eq_ignore_ascii_case(keyword));
            }
            proptest::prop_assert_eq!(parse_duration_ms(decimal.as_bytes()), reference_duration_ms(&decimal));
            let as_integer = text.parse::<u64>().ok().filter(|_| text.bytes().all(|b| b.is_ascii_digit()));
            proptest::prop_assert_eq!(parse_integer(text.as_bytes()), as_integer);
            proptest::prop_assert_eq!(parse_integer(big.to_string().as_bytes()), Some(big));
            let beyond = (u128::from(u64::MAX) + 1 + u128::from(over)).to_string();
            proptest::prop_assert_eq!(parse_integer(beyond.as_bytes()), None);
        }
    }
}
