//! `setters!`, for the builder methods that only set one field.

/// Defines builder methods that each set one field and return the builder:
/// `$(#[doc = …])* name(param: Type) => field = value;` becomes
/// `pub fn name(mut self, param: Type) -> Self { self.field = value; self }`.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($param:ident: $ty:ty) => $field:ident = $value:expr;)+) => {
        $(
            $(#[$attr])*
            pub fn $name(mut self, $param: $ty) -> Self {
                self.$field = $value;
                self
            }
        )+
    };
}
