//! The bench binaries' command lines: `--flag value` words read in order,
//! one way for every binary.

/// The words after the program name; a flag's value is taken on request.
#[derive(Debug)]
pub struct Words(std::iter::Skip<std::env::Args>);

impl Words {
    /// This process's arguments.
    pub fn from_env() -> Words {
        Words(std::env::args().skip(1))
    }

    /// The word after `flag`: its value, or an error naming the flag.
    pub fn value(&mut self, flag: &str) -> anyhow::Result<String> {
        self.0
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
    }
}

impl Iterator for Words {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        self.0.next()
    }
}
